// Type-checks Grafana dashboard JSON against @grafana/schema's `Dashboard` with tsc.
//
//   node typecheck.mjs [DIR]     (default: ./json; `npm run check` runs it on ./json)
//
// Why not `const d: Dashboard = json` with resolveJsonModule: TypeScript widens every string in
// an imported JSON module to `string`, so fields typed as literal unions (fieldConfig color mode,
// variable type, ...) make even a valid dashboard fail. Each dashboard is therefore embedded as an
// object literal in a generated .ts file, `export const d: Dashboard = {...}`: a literal keeps its
// string literal types and also gets TypeScript's excess-property check, so a misspelt field is an
// error too. The schema's string enums (ThresholdsMode, FieldColorModeId, MappingType, ...) are
// nominal in TypeScript: no string literal is assignable to them, although their values are
// exactly what the JSON holds. `AsJson<T>` below maps every string-like type to the union of its
// values (`${E}`), recursively, and changes nothing else, so the check is the schema's own shape.
// Exits non-zero (tsc's status) when any dashboard does not type-check.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const src = resolve(process.argv[2] ?? join(here, 'json'));
// Generated files live under dashboards/ so that '@grafana/schema' resolves from node_modules here;
// one folder per input directory, so concurrent checks of different directories do not collide.
const out = join(here, '.typecheck', createHash('sha1').update(src).digest('hex').slice(0, 12));
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

const files = readdirSync(src).filter((f) => f.endsWith('.json')).sort();
if (files.length === 0) {
  console.error(`typecheck: no dashboard JSON in ${src}`);
  process.exit(2);
}
for (const f of files) {
  let text = readFileSync(join(src, f), 'utf8');
  try {
    JSON.parse(text);
  } catch (e) {
    console.error(`typecheck: ${join(src, f)} is not valid JSON: ${e.message}`);
    process.exit(1);
  }
  const ts = `// generated from ${join(src, f)} by typecheck.mjs\n` +
    `import type { Dashboard } from '@grafana/schema';\n` +
    `type AsJson<T> = T extends string ? \`\${T}\`\n` +
    `  : T extends number | boolean | null | undefined ? T\n` +
    `  : T extends readonly (infer U)[] ? AsJson<U>[]\n` +
    `  : T extends object ? { [K in keyof T]: AsJson<T[K]> } : T;\n` +
    `export const d: AsJson<Dashboard> = ${text.trim()};\n`;
  writeFileSync(join(out, basename(f, '.json') + '.ts'), ts);
}
writeFileSync(join(out, 'tsconfig.json'), JSON.stringify({ extends: '../../tsconfig.json', include: ['*.ts'] }));
const tsc = join(here, 'node_modules', 'typescript', 'bin', 'tsc');
try {
  execFileSync(process.execPath, [tsc, '-p', join(out, 'tsconfig.json')], { stdio: 'inherit' });
} catch (e) {
  process.exit(e.status ?? 1);
}
console.log(`typecheck: ${files.length} dashboards in ${src} match @grafana/schema Dashboard`);
