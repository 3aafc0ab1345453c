"""Plain helpers that test modules of both tiers import: message builders, rigs, paths. No
fixtures and no services here (those are in tests/integration/)."""
