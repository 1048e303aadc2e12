//! Host time of one full step (propose + pack + accept + update) with the caches warm and
//! with them evicted first, as a verification pass leaves them: a forward streams the model's
//! weights (hundreds of MiB) through every cache level, so the drafter's tables are read from
//! memory on the next step. Run with `cargo bench -p recap-benches --bench cold_cache`.
use recap_benches::Simulator;
use recap_core::peers::{Autoregressive, SuffixTreeConfig, SuffixTreeDrafter};
use recap_core::{RecapConfig, RecapDrafter, SharedMemory, TokenSet};
use std::hint::black_box;
use std::time::Instant;

fn full_step(sim: &mut Simulator, mask: &mut Vec<bool>) -> usize {
    let t = sim.session.propose().unwrap();
    mask.resize(t.len() * t.len(), false);
    t.write_ancestor_mask(mask);
    sim.verify_current_tree();
    sim.observe()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    // Written between steps, outside the timed region: larger than any last-level cache.
    let vocab = recap_benches::VOCAB;
    let mut junk = vec![0u8; 256 << 20];
    for name in ["ar", "suffix", "recap auto"] {
        let m = SharedMemory::new(vocab, 8, SharedMemory::DEFAULT_CAPACITY).unwrap();
        let d: Box<dyn recap_core::Drafter> = match name {
            "ar" => Box::new(Autoregressive),
            "suffix" => Box::new(
                SuffixTreeDrafter::new(SuffixTreeConfig::default(), TokenSet::new(vocab)).unwrap(),
            ),
            _ => Box::new(
                RecapDrafter::new(
                    RecapConfig {
                        suffix_len: 16,
                        suffix_adaptive: true,
                        ..Default::default()
                    },
                    m.clone(),
                    &[],
                )
                .unwrap(),
            ),
        };
        let mut sim = Simulator::with_drafter(d, m, 42);
        if name == "recap auto" {
            let cost = (1..=96).map(|n| 0.035 + 0.0015 * n as f32).collect();
            sim.session.set_auto_budget(Some(cost)).unwrap();
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
                black_box(full_step(&mut sim, &mut mask));
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
            println!(
                "{name:>10} cold={cold}: median {:.1} us per full step",
                median(times)
            );
        }
    }
}
