// The JavaScript side of the tokenizer throughput comparison (docs/BENCHMARKS.md): js-tiktoken
// (GPT-2 ranks) and llama3-tokenizer-js on the same text, single-threaded, median of N runs.
// Usage (scratch directory): npm install js-tiktoken@1.0.21 llama3-tokenizer-js@1.2.0
//   cp <repo>/bench/tokenizer_bench_js.mjs . && node tokenizer_bench_js.mjs <text file> [reps]
import fs from "node:fs";
import { getEncoding } from "js-tiktoken";
import llama3Tokenizer from "llama3-tokenizer-js";

const text = fs.readFileSync(process.argv[2], "utf8");
const reps = Number(process.argv[3] ?? 5);
const bytes = Buffer.byteLength(text, "utf8");
const gpt2 = getEncoding("gpt2");
for (const [name, encode] of [
  ["js-tiktoken gpt2", (t) => gpt2.encode(t, [], [])],
  ["llama3-tokenizer-js", (t) => llama3Tokenizer.encode(t, { bos: false, eos: false })],
]) {
  encode(text.slice(0, 1000));  // load tables / JIT warm-up outside the timing
  const times = [];
  let n = 0;
  for (let r = 0; r < reps; ++r) {
    const t0 = process.hrtime.bigint();
    n = encode(text).length;
    times.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  times.sort((a, b) => a - b);
  const median = times[Math.floor(times.length / 2)];
  console.log(`${name}: ${bytes} bytes -> ${n} tokens; median of ${reps}: ${median.toFixed(3)} s, ${(bytes / 1e6 / median).toFixed(2)} MB/s`);
}
