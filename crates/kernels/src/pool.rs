//! A persistent thread pool for decode-sized work: workers spin briefly on a
//! generation counter (so back-to-back matmuls don't pay a futex wake-up),
//! then park on a condvar. One `run` = one fork/join; the join is a single
//! atomic counter the caller spins on.
//!
//! ```
//! use damascus_kernels::pool::{ThreadPool, split_range};
//! let pool = ThreadPool::new(2);
//! let sums: Vec<std::sync::atomic::AtomicUsize> = (0..2).map(|_| Default::default()).collect();
//! pool.run(&|t, n| {
//!     let r = split_range(100, 1, t, n);
//!     sums[t].store(r.sum(), std::sync::atomic::Ordering::Relaxed);
//! });
//! assert_eq!(sums.iter().map(|s| s.load(std::sync::atomic::Ordering::Relaxed)).sum::<usize>(), 4950);
//! ```

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN_FOR: Duration = Duration::from_micros(300);

type Job = *const (dyn Fn(usize, usize) + Sync + 'static);

struct Shared {
    /// The current job; written by the caller of `run` only while every worker
    /// is idle, read by workers after they observe a new `generation`.
    job: UnsafeCell<Job>,
    n_threads: usize,
    generation: AtomicU64,
    /// Workers that have not yet finished the current job.
    remaining: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written by the single `run` in progress (guarded by
// `ThreadPool::busy`) while no worker reads it (all finished the previous job,
// `remaining == 0`), and published with a SeqCst `generation` bump that
// workers read before dereferencing it. All other fields are Sync.
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced under the protocol above.
unsafe impl Send for Shared {}

/// A fixed set of worker threads executing `Fn(thread_idx, n_threads)` jobs.
pub struct ThreadPool {
    shared: Arc<Shared>,
    busy: AtomicBool,
    handles: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}

impl ThreadPool {
    /// A pool of `n_threads` (≥ 1; the caller of `run` is thread 0, so
    /// `n_threads - 1` OS threads are spawned).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n = n_threads.max(1);
        let noop: &'static (dyn Fn(usize, usize) + Sync) = &|_, _| {};
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(noop as Job),
            n_threads: n,
            generation: AtomicU64::new(0),
            remaining: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let handles = (1..n)
            .map(|t| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("damascus-w{t}"))
                    .spawn(move || worker(&s, t))
                    .expect("spawning a pool worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            busy: AtomicBool::new(false),
            handles,
        }
    }

    /// A pool sized to the physical cores of this machine.
    pub fn with_physical_cores() -> ThreadPool {
        ThreadPool::new(physical_cores())
    }

    /// Number of threads taking part in each `run` (including the caller).
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(thread_idx, n_threads)` on every thread (the caller is thread
    /// 0) and returns when all are done. A panic in any thread is re-raised
    /// here after all threads have finished. Re-entrant or concurrent calls
    /// run `f` for every index serially on the calling thread.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.shared.n_threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            (0..n).for_each(|t| f(t, n));
            return;
        }
        let s = &*self.shared;
        // SAFETY: erasing the lifetime is sound because this function does not
        // return (normally or by unwinding: see `Join`) before every worker
        // has finished with the job (`remaining == 0`).
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), Job>(f) };
        // SAFETY: we hold `busy` and all workers are idle (remaining == 0 at
        // the end of the previous run), so nobody reads `job` concurrently.
        unsafe { *s.job.get() = job };
        s.remaining.store(n - 1, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        struct Join<'a>(&'a ThreadPool);
        impl Drop for Join<'_> {
            fn drop(&mut self) {
                let s = &*self.0.shared;
                let mut spins = 0u32;
                while s.remaining.load(Ordering::Acquire) != 0 {
                    spins += 1;
                    if spins < 1 << 16 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                self.0.busy.store(false, Ordering::Release);
            }
        }
        let join = Join(self);
        f(0, n);
        drop(join);
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a thread-pool worker panicked");
        }
    }
}

fn worker(s: &Shared, t: usize) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::SeqCst);
            if g != seen {
                seen = g;
                break;
            }
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) || start.elapsed() < SPIN_FOR {
                std::hint::spin_loop();
                continue;
            }
            let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while s.generation.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst)
            {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        // SAFETY: the job was stored before the generation bump we observed
        // (SeqCst), and stays alive until we decrement `remaining` below.
        let job = unsafe { &**s.job.get() };
        if catch_unwind(AssertUnwindSafe(|| job(t, s.n_threads))).is_err() {
            s.panicked.store(true, Ordering::SeqCst);
        }
        s.remaining.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Thread `t`'s share of `0..n` when split evenly over `nt` threads in units
/// of `align` (the last unit may be partial).
pub fn split_range(n: usize, align: usize, t: usize, nt: usize) -> Range<usize> {
    let align = align.max(1);
    let nt = nt.max(1);
    let units = n.div_ceil(align);
    let (q, r) = (units / nt, units % nt);
    let start = t * q + t.min(r);
    let len = q + usize::from(t < r);
    (start * align).min(n)..((start + len) * align).min(n)
}

/// Number of physical cores available to this process (at most the logical
/// CPUs it may run on; falls back to the logical count).
pub fn physical_cores() -> usize {
    let info = crate::cpu::CpuInfo::gather();
    let usable = info
        .usable_threads
        .or(info.threads)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    info.cores.map_or(usable, |c| c.min(usable)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything() {
        for n in [0, 1, 7, 100, 3072] {
            for align in [1, 4, 8] {
                for nt in 1..6 {
                    let mut next = 0;
                    for t in 0..nt {
                        let r = split_range(n, align, t, nt);
                        assert_eq!(r.start, next);
                        assert!(r.start.is_multiple_of(align) || r.start == n);
                        next = r.end;
                    }
                    assert_eq!(next, n);
                }
            }
        }
    }

    #[test]
    fn runs_every_index_many_times() {
        let pool = ThreadPool::new(3);
        let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for i in 0..2000 {
            pool.run(&|t, n| {
                assert_eq!(n, 3);
                hits[t].fetch_add(1, Ordering::Relaxed);
            });
            if i == 1000 {
                // Let the workers park, then wake them again.
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 2000));
    }

    #[test]
    fn worker_panic_is_reraised_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|t, _| {
                if t == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn nested_run_is_serial_not_deadlock() {
        let pool = ThreadPool::new(2);
        let count = AtomicUsize::new(0);
        pool.run(&|t, _| {
            if t == 0 {
                pool.run(&|_, _| {
                    count.fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
