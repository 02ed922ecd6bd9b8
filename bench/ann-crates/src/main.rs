//! The approximate nearest-neighbour crates compared on segment vectors, for the dense first stage's index
//! (BENCHMARKS.md, "The dense first stage at scale"): usearch (HNSW in C++, f32 or f16), hnsw_rs (HNSW in
//! Rust, in memory) and hannoy (meilisearch's HNSW on LMDB), each at degree 16 and construction list 128, on
//! two threads; recall@100 of segments against exact search and single-thread query time at three search
//! lists. Not part of the product or CI: `bench/ann-crates.sh` runs it.
//!
//! usage: anncmp VECTORS.f32 DIMS SEGMENTS QUERIES usearch|usearch16|hnsw_rs|hannoy  (JSON lines out)
use std::time::Instant;

fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find(|l| l.starts_with("VmRSS")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
}
fn unit(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= n);
}
/// Seeded xorshift; `g` is roughly Gaussian (a sum of four uniforms, standard deviation 0.58).
struct Rng(u64);
impl Rng {
    fn u(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
    fn g(&mut self) -> f32 {
        (0..4).map(|_| self.u()).sum::<f32>() - 2.0
    }
}
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (path, d, n, q, which) = (
        &a[1],
        a[2].parse::<usize>().unwrap(),
        a[3].parse::<usize>().unwrap(),
        a[4].parse::<usize>().unwrap(),
        a[5].as_str(),
    );
    let bytes = std::fs::read(path).unwrap();
    let real: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let r = real.len() / d;
    let mut rng = Rng(0x9e3779b97f4a7c15);
    // Segment i >= r mixes two real segments (weight 0.2-0.8 on the second) plus a little noise (length 0.05):
    // distinct vectors that keep the real embeddings' structure.
    let small = 0.05 / (d as f32).sqrt() / 0.58;
    let make = |i: usize, rng: &mut Rng| {
        let mut v = real[(i % r) * d..(i % r + 1) * d].to_vec();
        if i >= r {
            let j = (rng.u() * r as f32) as usize % r;
            let w = 0.2 + 0.6 * rng.u();
            v.iter_mut().zip(&real[j * d..(j + 1) * d]).for_each(|(x, y)| *x += w * y + small * rng.g());
        }
        unit(&mut v);
        v
    };
    let base: Vec<f32> = (0..n).flat_map(|i| make(i, &mut rng)).collect();
    let queries: Vec<Vec<f32>> = (0..q).map(|i| make(r + i * 7919, &mut rng)).collect();
    // exact top-100
    let k = 100;
    let truth: Vec<Vec<usize>> = {
        use rayon::prelude::*;
        queries
            .par_iter()
            .map(|qv| {
                let mut s: Vec<(f32, usize)> = (0..n).map(|i| (dot(qv, &base[i * d..(i + 1) * d]), i)).collect();
                s.select_nth_unstable_by(k, |a, b| b.0.total_cmp(&a.0));
                s.truncate(k);
                s.into_iter().map(|x| x.1).collect()
            })
            .collect()
    };
    // exact single-thread query time
    let t = Instant::now();
    for qv in queries.iter().take(20) {
        let mut best = f32::MIN;
        for i in 0..n {
            best = best.max(dot(qv, &base[i * d..(i + 1) * d]));
        }
        std::hint::black_box(best);
    }
    let exact_ms = t.elapsed().as_secs_f64() * 1000.0 / 20.0;
    let rss0 = rss_kb();
    let dir = tempfile_dir(which);
    let t = Instant::now();
    let search: Box<dyn Fn(&[f32], usize) -> Vec<u64>>;
    let disk: u64;
    match which {
        "usearch" | "usearch16" => {
            use usearch::{Index, IndexOptions, MetricKind, ScalarKind};
            let opts = IndexOptions {
                dimensions: d,
                metric: MetricKind::Cos,
                quantization: if which == "usearch16" { ScalarKind::F16 } else { ScalarKind::F32 },
                connectivity: 16,
                expansion_add: 128,
                expansion_search: 64,
                multi: false,
            };
            let index = Index::new(&opts).unwrap();
            index.reserve(n).unwrap();
            std::thread::scope(|s| {
                for t in 0..2 {
                    let (index, base) = (&index, &base);
                    s.spawn(move || {
                        for i in (t..n).step_by(2) {
                            index.add(i as u64, &base[i * d..(i + 1) * d]).unwrap();
                        }
                    });
                }
            });
            let p = format!("{dir}/u.usearch");
            index.save(&p).unwrap();
            disk = std::fs::metadata(&p).unwrap().len();
            search = Box::new(move |qv, ef| {
                index.change_expansion_search(ef);
                index.search(qv, k).unwrap().keys
            });
        }
        "hannoy" => {
            use hannoy::{Database, Reader, Writer, distances::Cosine};
            let env = unsafe { heed::EnvOpenOptions::new().map_size(64 << 30).open(&dir).unwrap() };
            let w = env.write_txn().unwrap();
            let db: Database<Cosine> = env
                .create_databases_and_commit(w, |dbo, w| -> heed::Result<_> {
                    dbo.create_database(w, None).map(heed::CommitOrAbort::<_, ()>::Commit)
                })
                .unwrap()
                .unwrap_commit();
            let mut w = env.write_txn().unwrap();
            let writer: Writer<Cosine> = Writer::new(db, 0, d);
            for i in 0..n {
                writer.add_item(&mut w, i as u32, &base[i * d..(i + 1) * d]).unwrap();
            }
            let mut r = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(42);
            writer.builder(&mut r).ef_construction(128).build::<16, 32>(&mut w).unwrap();
            w.commit().unwrap();
            disk = std::fs::metadata(format!("{dir}/data.mdb")).unwrap().len();
            let env: &'static heed::Env = Box::leak(Box::new(env));
            search = Box::new(move |qv, ef| {
                let rt = env.read_txn().unwrap();
                let rd = Reader::<Cosine>::open(&rt, 0, db).unwrap();
                rd.nns(k).ef_search(ef).by_vector(&rt, qv).unwrap().into_nns().into_iter().map(|x| x.0 as u64).collect()
            });
        }
        "hnsw_rs" => {
            use hnsw_rs::prelude::*;
            let h: Hnsw<f32, DistCosine> = Hnsw::new(16, n, 16, 128, DistCosine {});
            let rows: Vec<Vec<f32>> = (0..n).map(|i| base[i * d..(i + 1) * d].to_vec()).collect();
            let refs: Vec<(&Vec<f32>, usize)> = rows.iter().enumerate().map(|(i, v)| (v, i)).collect();
            h.parallel_insert(&refs);
            disk = 0;
            let h: &'static Hnsw<f32, DistCosine> = Box::leak(Box::new(h));
            search = Box::new(move |qv, ef| h.search(qv, k, ef).into_iter().map(|x| x.d_id as u64).collect());
        }
        _ => panic!(),
    }
    let build_s = t.elapsed().as_secs_f64();
    let rss = rss_kb().saturating_sub(rss0);
    for ef in [100, 200, 400] {
        let mut times = vec![];
        let mut hit = 0;
        for (qv, tr) in queries.iter().zip(&truth) {
            let t = Instant::now();
            let got = search(qv, ef);
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            let set: std::collections::HashSet<u64> = got.into_iter().collect();
            hit += tr.iter().filter(|i| set.contains(&(**i as u64))).count();
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{{\"crate\":\"{which}\",\"n\":{n},\"build_s\":{build_s:.1},\"rss_mb\":{},\"disk_mb\":{},\"ef\":{ef},\"recall100\":{:.4},\"p50_ms\":{:.3},\"exact_ms\":{exact_ms:.2}}}",
            rss / 1024,
            disk >> 20,
            hit as f64 / (k * queries.len()) as f64,
            times[times.len() / 2]
        );
    }
}
fn tempfile_dir(w: &str) -> String {
    let d = std::env::temp_dir().join(format!("anncmp-{w}")).to_string_lossy().into_owned();
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
