//! Host state of RECAP after simulating 1,000 requests of 200 generated tokens at a
//! 151,936-token vocabulary (default settings). `cargo run --release -p recap-benches --bin state_size`

use recap_benches::{Simulator, VOCAB};
use recap_core::RecapConfig;

fn main() {
    let mut sim = Simulator::new(RecapConfig::default(), 7);
    let mut peak = 0usize;
    let requests: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    for r in 0..requests {
        sim.run_request(100, 200);
        peak = peak.max(sim.state_bytes());
        if (r + 1) % 250 == 0 || r + 1 == requests {
            let mib = |b: usize| b as f64 / (1 << 20) as f64;
            let (rows, evicted) = {
                let u = sim.memory.read();
                (u.len(), u.evictions())
            };
            println!(
                "after {:4} requests: state {:.2} MiB (peak {:.2} MiB), U rows {} (evicted {}), updates {}",
                r + 1,
                mib(sim.state_bytes()),
                mib(peak),
                rows,
                evicted,
                sim.updates
            );
        }
    }
    println!(
        "vocabulary {VOCAB}, K 8, U capacity {}",
        sim.memory.read().capacity()
    );
}
