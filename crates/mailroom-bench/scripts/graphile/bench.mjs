// Graphile Worker drain, measured the way `mailroom-bench drain` measures
// mailroom: on a fresh database of the server, N no-op jobs preloaded, then
// one worker process drains them; timed from `run()` until the jobs table
// is empty (every completion committed). Beside jobs/s, the database's work
// per 1,000 jobs: PostgreSQL CPU-seconds (this database's backends and
// autovacuum workers plus the server's shared processes, from /proc,
// sampled every 200 ms) and WAL (pg_current_wal_lsn, pg_stat_wal).
//
// Run through ../graphile.sh, which installs graphile-worker and a Node that
// it supports into a temporary directory and copies this file there.
//
// Options: --store URL (default $MAILROOM_TEST_POSTGRES_URL) --jobs 100000
// --concurrency 24 --local-queue 500 --pool 25 --payload-size 256
// --timeout 600 (seconds) --json

import { readdirSync, readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import pg from "pg";
import { Logger, run, runMigrations } from "graphile-worker";

const { values: opt } = parseArgs({
  options: {
    store: { type: "string", default: process.env.MAILROOM_TEST_POSTGRES_URL },
    jobs: { type: "string", default: "100000" },
    concurrency: { type: "string", default: "24" },
    "local-queue": { type: "string", default: "500" },
    pool: { type: "string", default: "25" },
    "payload-size": { type: "string", default: "256" },
    timeout: { type: "string", default: "600" },
    json: { type: "boolean", default: false },
  },
});
const jobs = Number(opt.jobs);
const concurrency = Number(opt.concurrency);
if (!opt.store) {
  console.error("graphile bench: give --store postgres://... or set MAILROOM_TEST_POSTGRES_URL");
  process.exit(64);
}

const dbName = `graphile_bench_${process.pid}`;
const withDb = (url, db) => {
  const u = new URL(url);
  u.pathname = `/${db}`;
  return u.toString();
};
const url = withDb(opt.store, dbName);

/** CPU seconds so far of one /proc/<pid>/stat (utime + stime). */
function cpuOf(pid) {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = s.slice(s.lastIndexOf(")") + 2).split(" ");
    return { ppid: f[1], secs: (Number(f[11]) + Number(f[12])) / 100 };
  } catch {
    return null;
  }
}

/** PostgreSQL processes working for this run, with their kind and CPU. */
function pgProcesses() {
  const out = [];
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    let comm, cmd;
    try {
      comm = readFileSync(`/proc/${pid}/comm`, "utf8");
      cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ").trim();
    } catch {
      continue;
    }
    if (!comm.startsWith("postgres")) continue;
    const cpu = cpuOf(pid);
    if (!cpu) continue;
    let kind = null;
    if (!cmd.startsWith("postgres: ")) {
      let parent = "";
      try {
        parent = readFileSync(`/proc/${cpu.ppid}/comm`, "utf8");
      } catch {}
      // A child forked a moment ago still has the postmaster's title.
      kind = parent.startsWith("postgres") ? null : "postmaster";
    } else {
      const rest = cmd.slice("postgres: ".length);
      const words = rest.split(/\s+/);
      if (rest.startsWith("autovacuum worker ")) {
        kind = words[2] === dbName ? "pg autovacuum" : null;
      } else if (words.length >= 3 && words[2].includes("(")) {
        kind = words[1] === dbName ? "pg backends" : null;
      } else {
        kind = `pg ${rest}`;
      }
    }
    out.push({ pid, kind, secs: cpu.secs });
  }
  return out;
}

/** CPU per process between start() and finish(), by kind. */
function cpuSampler() {
  const seen = new Map();
  const scan = (first) => {
    for (const p of pgProcesses()) {
      const e = seen.get(p.pid) ?? { first: first ? p.secs : 0 };
      e.kind = p.kind;
      e.last = p.secs;
      seen.set(p.pid, e);
    }
  };
  scan(true);
  const timer = setInterval(() => scan(false), 200);
  return () => {
    clearInterval(timer);
    scan(false);
    const byKind = {};
    for (const e of seen.values()) {
      if (e.kind) byKind[e.kind] = (byKind[e.kind] ?? 0) + Math.max(0, e.last - e.first);
    }
    return byKind;
  };
}

async function walReading(client) {
  const lsn = await client.query("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint AS b");
  let stat = null;
  try {
    const r = await client.query("SELECT wal_records, wal_fpi FROM pg_stat_wal");
    stat = { records: Number(r.rows[0].wal_records), fpi: Number(r.rows[0].wal_fpi) };
  } catch {}
  return { bytes: Number(lsn.rows[0].b), stat };
}

const quiet = new Logger(() => (level, message) => {
  if (level === "error") console.error(`graphile-worker: ${message}`);
});

async function preload(client) {
  const pad = "x".repeat(Math.max(0, Number(opt["payload-size"]) - 20));
  const started = performance.now();
  for (let done = 0; done < jobs; ) {
    const n = Math.min(10000, jobs - done);
    await client.query(
      `SELECT count(*) FROM graphile_worker.add_jobs(array(
         SELECT row('noop', json_build_object('i', i, 'pad', $2::text), null, null, null, null, null, null)
                ::graphile_worker.job_spec
         FROM generate_series(1, $1) i))`,
      [n, pad],
    );
    done += n;
  }
  return (performance.now() - started) / 1000;
}

async function drain(client, preset) {
  let handled = 0;
  const walBefore = await walReading(client);
  const finishCpu = cpuSampler();
  const started = performance.now();
  const runner = await run({
    preset,
    logger: quiet,
    noHandleSignals: true,
    taskList: { noop: async () => void handled++ },
  });
  const deadline = started + Number(opt.timeout) * 1000;
  while (handled < jobs && performance.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  let left = jobs;
  while (performance.now() < deadline) {
    left = Number((await client.query("SELECT count(*) AS n FROM graphile_worker._private_jobs")).rows[0].n);
    if (left === 0) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  const secs = (performance.now() - started) / 1000;
  const cpu = finishCpu();
  await runner.stop();
  await new Promise((r) => setTimeout(r, 200));
  const walAfter = await walReading(client);
  if (left !== 0) throw new Error(`drain timed out: ${left} of ${jobs} jobs left`);
  return { secs, cpu, walBefore, walAfter };
}

function dbWork({ cpu, walBefore, walAfter }) {
  const cpuSecs = Object.values(cpu).reduce((a, b) => a + b, 0);
  const walBytes = walAfter.bytes - walBefore.bytes;
  const stat = walBefore.stat && walAfter.stat;
  return {
    cpu_secs: cpuSecs,
    backend_cpu_secs: cpu["pg backends"] ?? 0,
    cpu_by_kind: cpu,
    wal_bytes: walBytes,
    wal_records: stat ? walAfter.stat.records - walBefore.stat.records : null,
    wal_fpi: stat ? walAfter.stat.fpi - walBefore.stat.fpi : null,
    cpu_secs_per_1k: (cpuSecs * 1000) / jobs,
    wal_bytes_per_1k: (walBytes * 1000) / jobs,
    wal_records_per_event: stat ? (walAfter.stat.records - walBefore.stat.records) / jobs : null,
    wal_fpi_per_event: stat ? (walAfter.stat.fpi - walBefore.stat.fpi) / jobs : null,
    events_per_cpu_sec: cpuSecs > 0 ? jobs / cpuSecs : 0,
  };
}

async function main() {
  const admin = new pg.Client({ connectionString: opt.store });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${dbName}`);
  const client = new pg.Client({ connectionString: url });
  try {
    await client.connect();
    const preset = {
      worker: {
        connectionString: url,
        concurrentJobs: concurrency,
        maxPoolSize: Number(opt.pool),
        localQueue: { size: Number(opt["local-queue"]) },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    };
    await runMigrations({ preset, logger: quiet });
    const preloadSecs = await preload(client);
    const d = await drain(client, preset);
    const result = {
      bench: "graphile",
      graphile_worker: JSON.parse(readFileSync(new URL("./node_modules/graphile-worker/package.json", import.meta.url))).version,
      node: process.version,
      jobs,
      settings: { ...preset.worker, connectionString: undefined },
      preload_secs: preloadSecs,
      drain_secs: d.secs,
      jobs_per_sec: jobs / d.secs,
      db: dbWork(d),
    };
    if (opt.json) {
      console.log(JSON.stringify(result));
    } else {
      const w = result.db;
      console.log(
        `graphile-worker ${result.graphile_worker} on Node ${result.node}: ${jobs} no-op jobs ` +
          `(concurrentJobs ${concurrency}, localQueue ${opt["local-queue"]}, maxPoolSize ${opt.pool}, ` +
          `completeJobBatchDelay 0, failJobBatchDelay 0); preload ${preloadSecs.toFixed(2)} s`,
      );
      console.log(
        `drain ${d.secs.toFixed(2)} s: ${result.jobs_per_sec.toFixed(0)} jobs/s; per 1,000 jobs ` +
          `${w.cpu_secs_per_1k.toFixed(3)} PostgreSQL CPU-s, ${(w.wal_bytes_per_1k / 2 ** 20).toFixed(2)} MiB WAL, ` +
          `${w.wal_records_per_event?.toFixed(1) ?? "-"} WAL records and ${w.wal_fpi_per_event?.toFixed(2) ?? "-"} ` +
          `full-page images per job; PostgreSQL CPU-s ` +
          Object.entries(w.cpu_by_kind)
            .filter(([, v]) => v >= 0.005)
            .map(([k, v]) => `${k} ${v.toFixed(2)}`)
            .join(", "),
      );
    }
  } finally {
    await client.end().catch(() => {});
    await admin.query(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
    await admin.end();
  }
}

main().catch((e) => {
  console.error(`graphile bench: ${e.stack ?? e}`);
  process.exit(1);
});
