"""Reliability accounting (issue 27): each job end classified by cause, the history kept in an
embedded store, and the figures of Kokolis et al. (HPCA 2025) computed from it: the failure rate
r_f, job MTTF by size, ETTR, lemon nodes and the GPU-hours lost. docs/reliability.md says how each
figure is defined and where fleetwatch differs from the paper."""
