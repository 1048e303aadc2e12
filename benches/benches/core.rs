//! Criterion benches of the host-side hot paths on a warmed state: vocabulary 151,936, K = 8,
//! default tree (63 nodes + 4 suffix, depth 10), tables warmed by >= 10,000 node updates.

use criterion::{criterion_group, criterion_main, Criterion};
use recap_benches::{cpu_like_cost, recap_auto_drafter, Simulator, VOCAB};
use recap_core::Proposal;
use recap_core::SuffixAutomaton;
use recap_core::{RecapConfig, RecapDrafter, SharedMemory};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn warmed() -> Simulator {
    let mut sim = Simulator::new(RecapConfig::default(), 42);
    while sim.updates < 20_000 {
        sim.run_request(200, 200);
    }
    sim.begin_request(200);
    for _ in 0..20 {
        sim.step();
    }
    sim
}

fn bench_steps(c: &mut Criterion) {
    let mut sim = warmed();
    eprintln!(
        "warm state: {} node updates, {:.2} MiB, tree of {} nodes",
        sim.updates,
        sim.state_bytes() as f64 / (1 << 20) as f64,
        sim.session.propose().unwrap().len()
    );
    let mut g = c.benchmark_group("recap");
    g.bench_function("propose (lookup+fusion+tree+suffix+preorder)", |b| {
        b.iter(|| black_box(sim.session.propose().unwrap().len()))
    });
    let mut mask = Vec::new();
    g.bench_function("propose + pack (ancestor mask)", |b| {
        b.iter(|| {
            let t = sim.session.propose().unwrap();
            mask.resize(t.len() * t.len(), false);
            t.write_ancestor_mask(&mut mask);
            black_box(mask[mask.len() - 1])
        })
    });
    g.bench_function("pack (ancestor mask, 68 nodes)", |b| {
        let t = sim.session.propose().unwrap().clone();
        mask.resize(t.len() * t.len(), false);
        b.iter(|| {
            t.write_ancestor_mask(&mut mask);
            black_box(mask[1])
        })
    });
    g.bench_function("update (accept + all evaluated rows + automaton)", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                sim.session.propose().unwrap();
                sim.verify_current_tree();
                let t = Instant::now();
                black_box(sim.observe());
                spent += t.elapsed();
            }
            spent
        })
    });
    g.bench_function("full step (propose + pack + update)", |b| {
        b.iter(|| black_box(sim.packed_step(&mut mask)))
    });
    g.finish();
}

fn bench_lookup(c: &mut Criterion) {
    let sim = warmed();
    let memory: SharedMemory = sim.memory.clone();
    let mut drafter = RecapDrafter::new(RecapConfig::default(), memory, &[]).unwrap();
    let keys: Vec<u32> = sim.session.history().to_vec();
    let mut out = Proposal::default();
    let mut i = 2;
    c.bench_function("fused lookup (G, C, U -> top-8)", |b| {
        b.iter(|| {
            i = if i + 1 >= keys.len() { 2 } else { i + 1 };
            drafter.fused_proposal(keys[i - 2], keys[i - 1], keys[i], &mut out);
            black_box(out.len())
        })
    });
}

fn bench_automaton(c: &mut Criterion) {
    let mut rng = recap_benches::Rng::new(3);
    let text: Vec<u32> = (0..1200).map(|_| rng.token() % 2000).collect();
    c.bench_function(
        "suffix automaton: append 1,200 tokens + match after each",
        |b| {
            b.iter(|| {
                let mut a = SuffixAutomaton::new();
                let mut total = 0usize;
                for &t in &text {
                    a.push(t);
                    total += a.continuation(4).0.len();
                }
                black_box(total)
            })
        },
    );
    let _ = VOCAB;
}

/// Every drafter behind the same session on the same synthetic target: host time of one
/// full step (propose + pack + accept + update), warmed like `warmed()`.
fn bench_peers(c: &mut Criterion) {
    use recap_core::peers::{
        Autoregressive, PromptLookup, SamDrafter, SuffixTreeConfig, SuffixTreeDrafter,
        TokenRecycling, TR_LEVELS,
    };
    use recap_core::TokenSet;
    let none = || TokenSet::new(VOCAB);
    let mem = || SharedMemory::new(VOCAB, 8, SharedMemory::DEFAULT_CAPACITY).unwrap();
    type Make = Box<dyn Fn(SharedMemory) -> Box<dyn recap_core::Drafter>>;
    let makers: Vec<(&str, Make)> = vec![
        ("ar", Box::new(|_| Box::new(Autoregressive))),
        (
            "pld",
            Box::new(move |_| Box::new(PromptLookup::new(2, 10, none()).unwrap())),
        ),
        (
            "tr (80-node template)",
            Box::new(move |m| Box::new(TokenRecycling::new(m, &TR_LEVELS, none()).unwrap())),
        ),
        (
            "sam",
            Box::new(move |_| Box::new(SamDrafter::new(60, none(), None).unwrap())),
        ),
        (
            "sam_tr",
            Box::new(move |m| {
                let tr = TokenRecycling::new(m, &TR_LEVELS, none()).unwrap();
                Box::new(SamDrafter::new(60, none(), Some((tr, 5))).unwrap())
            }),
        ),
        (
            "suffix",
            Box::new(move |_| {
                Box::new(SuffixTreeDrafter::new(SuffixTreeConfig::default(), none()).unwrap())
            }),
        ),
        (
            "recap (63 + 4)",
            Box::new(|m| Box::new(RecapDrafter::new(RecapConfig::default(), m, &[]).unwrap())),
        ),
    ];
    let mut g = c.benchmark_group("peers: full host step");
    let mut mask = Vec::new();
    for (name, make) in makers.iter().chain(std::iter::once(&(
        "recap auto budget (63 + 16 adaptive, cut by cost)",
        Box::new(recap_auto_drafter) as Make,
    ))) {
        let m = mem();
        let mut sim = Simulator::with_drafter(make(m.clone()), m, 42);
        if name.starts_with("recap auto") {
            sim.session.set_auto_budget(Some(cpu_like_cost())).unwrap();
        }
        while sim.updates < 20_000 {
            sim.run_request(200, 200);
        }
        sim.begin_request(200);
        g.bench_function(*name, |b| b.iter(|| black_box(sim.packed_step(&mut mask))));
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_steps,
    bench_lookup,
    bench_automaton,
    bench_peers
);
criterion_main!(benches);
