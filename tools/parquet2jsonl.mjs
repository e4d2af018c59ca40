// Streaming parquet -> JSON lines for `llmtrain prepare-data` (data.md section 4): reads one row
// group at a time with npm hyparquet (+ hyparquet-compressors for ZSTD, GZIP, BROTLI, LZ4;
// SNAPPY is built in) and writes one JSON object per row to stdout, with the columns `text`
// and the FineWeb-Edu metadata we may filter on (`int_score`, `score`, `token_count`, `id`,
// `meta` when present). BigInt values (INT64 columns) become JSON numbers. Errors go to stderr
// with the file name and the exit status is non-zero.
// Usage: node tools/parquet2jsonl.mjs FILE.parquet
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects } from "hyparquet";
import { compressors } from "hyparquet-compressors";

const KEEP = ["text", "int_score", "score", "token_count", "id", "meta"];

async function main() {
  const path = process.argv[2];
  if (!path) throw new Error("usage: node tools/parquet2jsonl.mjs FILE.parquet");
  const file = await asyncBufferFromFile(path);
  const metadata = await parquetMetadataAsync(file);
  const names = new Set(metadata.schema.slice(1).map((s) => s.name));
  if (!names.has("text")) throw new Error(`${path}: no column "text" (columns: ${[...names].join(", ")})`);
  const columns = KEEP.filter((c) => names.has(c));
  let rowStart = 0;
  for (const [index, group] of metadata.row_groups.entries()) {
    const rowEnd = rowStart + Number(group.num_rows);
    const rows = await parquetReadObjects({ file, metadata, columns, rowStart, rowEnd, compressors });
    let out = "";
    for (const row of rows) {
      out += JSON.stringify(row, (_, v) => (typeof v === "bigint" ? Number(v) : v)) + "\n";
    }
    if (!process.stdout.write(out)) await new Promise((r) => process.stdout.once("drain", r));
    if (rows.length !== Number(group.num_rows)) {
      throw new Error(`${path}: row group ${index} decoded ${rows.length} rows, its metadata says ${group.num_rows}`);
    }
    rowStart = rowEnd;
  }
}

main().catch((e) => {
  process.stderr.write(`parquet2jsonl: ${process.argv[2] ?? ""}: ${e && e.message ? e.message : e}\n`);
  process.exit(1);
});
