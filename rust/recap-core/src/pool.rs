//! A small process-wide pool of helper threads for `skinny_matmul`.
//!
//! A verification pass runs about 200 products in a row, each a few tens of microseconds on
//! each thread: spawning threads per product would cost as much as the product. The helpers
//! stay alive, spin briefly after a job (the next product of the pass follows within
//! microseconds) and then sleep, so an idle process costs nothing.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(200);
/// The most helpers the pool starts (parts past it run on the caller's thread).
const MAX_HELPERS: usize = 63;

type Task = dyn Fn(usize) + Sync;

struct Pool {
    /// One job at a time: callers from several threads take turns.
    submit: Mutex<()>,
    /// Bumped for every job; a helper runs part `index + 1` of each job it sees.
    generation: AtomicU64,
    /// The current job: its closure (lifetime erased; valid until `pending` is 0) and parts.
    job: Mutex<Option<(usize, usize)>>,
    wake: Condvar,
    pending: AtomicUsize,
    helpers: Mutex<usize>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        submit: Mutex::new(()),
        generation: AtomicU64::new(0),
        job: Mutex::new(None),
        wake: Condvar::new(),
        pending: AtomicUsize::new(0),
        helpers: Mutex::new(0),
    })
}

/// Runs `task(0)`, ..., `task(parts - 1)`: part 0 on the calling thread, the others on helpers;
/// returns when all have run.
pub(crate) fn run_parts(parts: usize, task: &(dyn Fn(usize) + Sync + '_)) {
    let parts = parts.min(MAX_HELPERS + 1);
    if parts <= 1 {
        task(0);
        return;
    }
    let p = pool();
    let _turn = p.submit.lock().unwrap_or_else(|e| e.into_inner());
    let parts = p.ensure_helpers(parts - 1) + 1;
    if parts == 1 {
        task(0);
        return;
    }
    // SAFETY (lifetime): the helpers only call the task while `pending` > 0, and this
    // function waits for it to reach 0 before `task` goes out of scope.
    let erased: &'static Task =
        unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Task>(task) };
    let raw = Box::into_raw(Box::new(erased)) as usize;
    p.pending.store(parts - 1, Ordering::SeqCst);
    {
        let mut job = p.job.lock().unwrap_or_else(|e| e.into_inner());
        *job = Some((raw, parts));
        p.generation.fetch_add(1, Ordering::SeqCst);
    }
    p.wake.notify_all();
    let _ = catch_unwind(AssertUnwindSafe(|| task(0)));
    while p.pending.load(Ordering::Acquire) != 0 {
        std::hint::spin_loop();
    }
    // SAFETY: made by Box::into_raw above; no helper reads it once pending is 0.
    drop(unsafe { Box::from_raw(raw as *mut &'static Task) });
}

impl Pool {
    /// Starts helpers up to `want`; returns how many there are, at most `want`.
    fn ensure_helpers(&'static self, want: usize) -> usize {
        let mut have = self.helpers.lock().unwrap_or_else(|e| e.into_inner());
        while *have < want {
            let index = *have;
            let seen = self.generation.load(Ordering::SeqCst);
            if std::thread::Builder::new()
                .name(format!("recap-mm-{index}"))
                .spawn(move || self.helper(index, seen))
                .is_err()
            {
                break; // no more threads: the parts past the helpers run on the caller
            }
            *have += 1;
        }
        want.min(*have)
    }

    fn helper(&self, index: usize, mut seen: u64) {
        loop {
            let started = Instant::now();
            while self.generation.load(Ordering::Acquire) == seen && started.elapsed() < SPIN {
                std::hint::spin_loop();
            }
            let (raw, parts) = {
                let mut job = self.job.lock().unwrap_or_else(|e| e.into_inner());
                while self.generation.load(Ordering::Acquire) == seen {
                    job = self.wake.wait(job).unwrap_or_else(|e| e.into_inner());
                }
                seen = self.generation.load(Ordering::Acquire);
                match *job {
                    Some(j) => j,
                    None => continue,
                }
            };
            if index + 1 < parts {
                // SAFETY: valid while pending > 0, and this helper has not yet counted down.
                let task: &Task = unsafe { *(raw as *const &'static Task) };
                let _ = catch_unwind(AssertUnwindSafe(|| task(index + 1)));
                self.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}
