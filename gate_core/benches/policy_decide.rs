//! Policy decisions against the number of rules (issue 13, target 5: flat in the number of
//! rules for exact and suffix hosts). Each policy is a file of N allow rules (`version = 1`,
//! parsed by `policy::file::from_toml`, the path the gate takes); three destinations are
//! decided on it with `Policy::decide_connect` and `Policy::decide_request`:
//! the first rule's host, the last rule's host, and a host no rule names (the default).
//! `load/{exact,suffix}/N` times `from_toml` of such a file (parsing, checking and indexing
//! the rules), which grows with N.
//!
//! Run: `cargo bench -p gate_core --bench policy_decide` (bench/run does it and reads the
//! estimates from target/criterion/*/new/estimates.json).

use std::hint::black_box;

use _gate_core::policy::{canonical_host, file::from_toml, Host, Policy, RequestFacts, Scheme};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const SIZES: [usize; 3] = [10, 1_000, 100_000];

/// A file of `n` allow rules: `h{i}.example.com` (exact) or `*.d{i}.example.com` (suffix).
fn text(n: usize, suffix: bool) -> String {
    let mut text = String::from("version = 1\ndefault = \"deny\"\n");
    for i in 0..n {
        let host = if suffix { format!("*.d{i}.example.com") } else { format!("h{i}.example.com") };
        text.push_str(&format!("[[rule]]\nhost = \"{host}\"\naction = \"allow\"\n"));
    }
    text
}

fn policy(n: usize, suffix: bool) -> Policy {
    from_toml(&text(n, suffix), "bench.toml").expect("the generated policy parses")
}

/// The destination rule `i` matches (`i == n`: one no rule matches).
fn target(i: usize, n: usize, suffix: bool) -> Host {
    let name = match (i == n, suffix) {
        (true, _) => "nowhere.example.net".to_string(),
        (false, false) => format!("h{i}.example.com"),
        (false, true) => format!("api.d{i}.example.com"),
    };
    canonical_host(&name).expect("a valid host")
}

fn bench(c: &mut Criterion) {
    for (kind, suffix) in [("exact", false), ("suffix", true)] {
        let mut group = c.benchmark_group(format!("decide_connect/{kind}"));
        for n in SIZES {
            let p = policy(n, suffix);
            for (case, i) in [("first", 0), ("last", n - 1), ("miss", n)] {
                let host = target(i, n, suffix);
                group.bench_with_input(BenchmarkId::new(case, n), &host, |b, h| {
                    b.iter(|| black_box(p.decide_connect(black_box(h), 443)))
                });
            }
        }
        group.finish();
        let mut group = c.benchmark_group(format!("decide_request/{kind}"));
        for n in SIZES {
            let p = policy(n, suffix);
            for (case, i) in [("first", 0), ("last", n - 1), ("miss", n)] {
                let host = target(i, n, suffix);
                group.bench_with_input(BenchmarkId::new(case, n), &host, |b, h| {
                    let facts = RequestFacts { host: h, port: 80, scheme: Scheme::Http, method: "GET", path: "/v1/models" };
                    b.iter(|| black_box(p.decide_request(black_box(&facts))))
                });
            }
        }
        group.finish();
    }
    let mut group = c.benchmark_group("load");
    // criterion's least: a load of 100,000 rules takes about half a second.
    group.sample_size(10);
    for (kind, suffix) in [("exact", false), ("suffix", true)] {
        for n in SIZES {
            let t = text(n, suffix);
            group.bench_with_input(BenchmarkId::new(kind, n), &t, |b, t| {
                b.iter_with_large_drop(|| from_toml(black_box(t), "bench.toml").expect("parses"))
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Short rounds: 42 decisions on policies of up to 100k rules and 6 loads, inside bench/run's 20 minutes.
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
