//! A synthetic target model and request simulator that warm RECAP's state the way real
//! decoding does (every evaluated node writes its row), for benchmarks and state-size figures.

use recap_core::{DraftSession, Drafter, RecapConfig, RecapDrafter, SharedMemory, TopKRows};

/// Qwen2.5-VL's vocabulary size.
pub const VOCAB: usize = 151_936;
pub const K: usize = 8;
const PROBS: [f32; K] = [0.45, 0.2, 0.1, 0.08, 0.06, 0.05, 0.03, 0.03];

#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ceb9fe1a85ec53);
    x ^ (x >> 33)
}

/// Maps a hash to a token id with a heavy-tailed (log-uniform) distribution, so that frequent
/// tokens repeat as in real text while the whole vocabulary is still reached.
#[inline]
fn skewed(h: u64) -> u32 {
    let u = (h % 1_000_000) as f64 / 1_000_000.0;
    ((VOCAB as f64).powf(u) as u32).min(VOCAB as u32 - 1)
}

/// A deterministic "target": its top-K after (prev, tok) depends mostly on tok and a little
/// on prev, with heavy-tailed ids (so U fills up over many requests as real text would).
pub fn target_row(prev: u32, tok: u32, ids: &mut [u32], probs: &mut [f32]) {
    let base = mix(tok as u64 * 8 + (prev as u64 % 3));
    let mut j = 0;
    let mut salt = 0u64;
    while j < K {
        let id = skewed(mix(base + salt));
        salt += 1;
        if !ids[..j].contains(&id) {
            ids[j] = id;
            probs[j] = PROBS[j];
            j += 1;
        }
    }
}

/// A simple xorshift generator for prompts.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Skewed token ids: small ids are much more frequent (roughly Zipf-like).
    pub fn token(&mut self) -> u32 {
        skewed(self.next_u64())
    }
}

pub struct Simulator {
    pub session: DraftSession,
    pub memory: SharedMemory,
    pred: Vec<u32>,
    ids: Vec<u32>,
    probs: Vec<f32>,
    rng: Rng,
    pub updates: usize,
}

impl Simulator {
    pub fn new(config: RecapConfig, seed: u64) -> Self {
        let memory = SharedMemory::new(VOCAB, config.k, SharedMemory::DEFAULT_CAPACITY).unwrap();
        let drafter = RecapDrafter::new(config, memory.clone(), &[]).unwrap();
        Self::with_drafter(Box::new(drafter), memory, seed)
    }

    /// Any drafter; `memory` is the shared row table it uses (or an unused one).
    pub fn with_drafter(drafter: Box<dyn Drafter>, memory: SharedMemory, seed: u64) -> Self {
        Simulator {
            session: DraftSession::new(drafter, VOCAB).unwrap(),
            memory,
            pred: Vec::new(),
            ids: Vec::new(),
            probs: Vec::new(),
            rng: Rng::new(seed),
            updates: 0,
        }
    }

    /// Starts a request with a random prompt and seeds U from its rows.
    pub fn begin_request(&mut self, prompt_len: usize) {
        let prompt: Vec<u32> = (0..prompt_len).map(|_| self.rng.token()).collect();
        self.session.begin(&prompt).unwrap();
        self.ids.resize(prompt_len * K, 0);
        self.probs.resize(prompt_len * K, 0.0);
        for i in 0..prompt_len {
            let prev = if i > 0 { prompt[i - 1] } else { 0 };
            let r = i * K..(i + 1) * K;
            target_row(
                prev,
                prompt[i],
                &mut self.ids[r.clone()],
                &mut self.probs[r],
            );
        }
        let rows = TopKRows::new(&self.ids, &self.probs, K, prompt_len, VOCAB).unwrap();
        self.session.seed(&rows, 0).unwrap();
    }

    /// Fills the target's rows for the current tree (what the verifier would return).
    pub fn verify_current_tree(&mut self) {
        let tree = self.session.tree();
        let n = tree.len();
        self.ids.resize(n * K, 0);
        self.probs.resize(n * K, 0.0);
        self.pred.clear();
        for i in 0..n {
            let (_, prev) = tree.context_of(i);
            let r = i * K..(i + 1) * K;
            target_row(
                prev,
                tree.tokens[i],
                &mut self.ids[r.clone()],
                &mut self.probs[r],
            );
            self.pred.push(self.ids[i * K]);
        }
    }

    /// Accept + update for the current (verified) tree; returns committed tokens.
    pub fn observe(&mut self) -> usize {
        let n = self.session.tree().len();
        let rows = TopKRows::new(&self.ids, &self.probs, K, n, VOCAB).unwrap();
        let acc = self.session.observe(&self.pred, &rows).unwrap();
        self.updates += n;
        acc.path.len()
    }

    /// One full step: propose, verify (synthetic), observe. Returns committed tokens.
    pub fn step(&mut self) -> usize {
        self.session.propose().unwrap();
        self.verify_current_tree();
        self.observe()
    }

    /// One full host step as decoding runs it: propose, pack the tree into its ancestor mask
    /// (`mask`, reused), verify (synthetic), observe. Returns committed tokens.
    pub fn packed_step(&mut self, mask: &mut Vec<bool>) -> usize {
        let t = self.session.propose().unwrap();
        mask.resize(t.len() * t.len(), false);
        t.write_ancestor_mask(mask);
        self.verify_current_tree();
        self.observe()
    }

    /// Runs a request of `new_tokens` generated tokens.
    pub fn run_request(&mut self, prompt_len: usize, new_tokens: usize) {
        self.begin_request(prompt_len);
        let mut produced = 0;
        while produced < new_tokens {
            produced += self.step();
        }
    }

    pub fn state_bytes(&self) -> usize {
        self.session.drafter().bytes()
    }
}

/// RECAP as `budget="auto"` drafts on a CPU: 63 nodes plus up to 16 adaptive suffix nodes,
/// cut by `cpu_like_cost()` once the session's budget is set.
pub fn recap_auto_drafter(memory: SharedMemory) -> Box<dyn Drafter> {
    let cfg = RecapConfig {
        suffix_len: 16,
        suffix_adaptive: true,
        ..Default::default()
    };
    Box::new(RecapDrafter::new(cfg, memory, &[]).unwrap())
}

/// A CPU-like cost curve for 1..=96 nodes: a pass over n tokens costs 35 ms + 1.5 ms per token.
pub fn cpu_like_cost() -> Vec<f32> {
    (1..=96).map(|n| 0.035 + 0.0015 * n as f32).collect()
}
