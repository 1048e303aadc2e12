//! Host time of one full step (propose + pack + accept + update) with the caches warm and
//! with them evicted first, as a verification pass leaves them: a forward streams the model's
//! weights (hundreds of MiB) through every cache level, so the drafter's tables are read from
//! memory on the next step. Run with `cargo bench -p recap-benches --bench cold_cache`.
use recap_benches::{cpu_like_cost, recap_auto_drafter, Simulator};
use recap_core::peers::{Autoregressive, SuffixTreeConfig, SuffixTreeDrafter};
use recap_core::{SharedMemory, TokenSet};
use std::hint::black_box;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let vocab = recap_benches::VOCAB;
    // Written between steps, outside the timed region: larger than any last-level cache.
    let mut junk = vec![0u8; 256 << 20];
    for name in ["ar", "suffix", "recap auto"] {
        let m = SharedMemory::new(vocab, 8, SharedMemory::DEFAULT_CAPACITY).unwrap();
        let d: Box<dyn recap_core::Drafter> = match name {
            "ar" => Box::new(Autoregressive),
            "suffix" => Box::new(
                SuffixTreeDrafter::new(SuffixTreeConfig::default(), TokenSet::new(vocab)).unwrap(),
            ),
            _ => recap_auto_drafter(m.clone()),
        };
        let mut sim = Simulator::with_drafter(d, m, 42);
        if name == "recap auto" {
            sim.session.set_auto_budget(Some(cpu_like_cost())).unwrap();
        }
        while sim.updates < 20_000 {
            sim.run_request(200, 200);
        }
        let mut mask = Vec::new();
        for cold in [false, true] {
            let mut times = Vec::new();
            sim.begin_request(200);
            for i in 0..400 {
                if i % 150 == 149 {
                    sim.begin_request(200); // requests of 150 steps, as in the warm-up
                }
                if cold {
                    for (j, b) in junk.iter_mut().enumerate().step_by(64) {
                        *b = b.wrapping_add(j as u8);
                    }
                    black_box(&junk);
                }
                let t = Instant::now();
                black_box(sim.packed_step(&mut mask));
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
            println!(
                "{name:>10} cold={cold}: median {:.1} us per full step",
                median(times)
            );
        }
    }
}
