//! A small process-wide pool of helper threads for `skinny_matmul`.
//!
//! A verification pass runs about 200 products in a row, each a few tens of microseconds on
//! each thread: spawning threads per product would cost as much as the product. The helpers
//! stay alive, spin briefly after a job (the next product of the pass follows within
//! microseconds) and then sleep, so an idle process costs nothing.
//!
//! Inside a process whose other work runs on an OpenMP team (torch's CPU backend), a second
//! set of spinning threads competes with that team for the same cores: a whole SmolLM2 pass
//! of 1-16 tokens took 1.7-2.1x longer so. `use_openmp` hands the parts to the process's own
//! OpenMP runtime instead (`GOMP_parallel`, which libgomp, LLVM's and Intel's runtimes all
//! export), so the products run on the team torch's operations run on.

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(200);
/// The most helpers the pool starts (parts past it run on the caller's thread).
const MAX_HELPERS: usize = 63;

type Task = dyn Fn(usize) + Sync;

type GompParallel =
    unsafe extern "C" fn(unsafe extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint);
type OmpQuery = unsafe extern "C" fn() -> c_int;

/// The OpenMP runtime's entry points, once `use_openmp` named them.
struct OpenMp {
    parallel: GompParallel,
    thread_num: OmpQuery,
    num_threads: OmpQuery,
}

static OPENMP: OnceLock<OpenMp> = OnceLock::new();

/// Runs every later job on the process's OpenMP runtime: `parallel`, `thread_num` and
/// `num_threads` are the addresses of its `GOMP_parallel`, `omp_get_thread_num` and
/// `omp_get_num_threads`. Returns false where a runtime was named already (the first stays).
///
/// # Safety
/// The addresses must be those functions of a runtime loaded for the life of the process.
pub unsafe fn use_openmp(parallel: usize, thread_num: usize, num_threads: usize) -> bool {
    if parallel == 0 || thread_num == 0 || num_threads == 0 {
        return false;
    }
    // SAFETY: the caller vouches for the addresses.
    let omp = unsafe {
        OpenMp {
            parallel: std::mem::transmute::<usize, GompParallel>(parallel),
            thread_num: std::mem::transmute::<usize, OmpQuery>(thread_num),
            num_threads: std::mem::transmute::<usize, OmpQuery>(num_threads),
        }
    };
    OPENMP.set(omp).is_ok()
}

/// Whether jobs run on an OpenMP runtime (`use_openmp`).
pub fn uses_openmp() -> bool {
    OPENMP.get().is_some()
}

struct OmpJob<'a> {
    task: &'a (dyn Fn(usize) + Sync + 'a),
    parts: usize,
    omp: &'a OpenMp,
}

unsafe extern "C" fn omp_body(data: *mut c_void) {
    // SAFETY: `data` is the OmpJob that `run_on_openmp` keeps alive until the region ends.
    let job = unsafe { &*(data as *const OmpJob<'_>) };
    // SAFETY: the runtime's own queries, called inside its parallel region.
    let (me, team) = unsafe { ((job.omp.thread_num)(), (job.omp.num_threads)()) };
    let (me, team) = (me.max(0) as usize, team.max(1) as usize);
    // A panic must not unwind into C; the part's output is then left as it was.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        for i in (me..job.parts).step_by(team) {
            (job.task)(i);
        }
    }));
}

fn run_on_openmp(omp: &OpenMp, parts: usize, task: &(dyn Fn(usize) + Sync + '_)) {
    let job = OmpJob { task, parts, omp };
    // SAFETY: GOMP_parallel runs omp_body on a team of up to `parts` threads (this one
    // included) and returns once every one has finished, so `job` outlives every use.
    unsafe {
        (omp.parallel)(
            omp_body,
            &job as *const OmpJob<'_> as *mut c_void,
            parts as c_uint,
            0,
        )
    };
}

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
    if let Some(omp) = OPENMP.get() {
        run_on_openmp(omp, parts, task);
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
