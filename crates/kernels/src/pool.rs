//! A persistent thread pool: workers spin briefly on a state word (so back-to-back ops don't
//! pay a futex wake-up), then park on a condvar, so an idle pool burns no core.
//!
//! **Work is handed out, not assigned.** Every fork/join is a set of tasks (indices
//! `0..n`) claimed one at a time through a single atomic word; whoever is running (the caller
//! included) takes the next unclaimed task, and a worker that arrives after every task is
//! claimed does nothing. So a thread descheduled by the OS (a busy neighbour, a shared vCPU)
//! costs the op at most the task it holds, never its whole fixed share, and the caller waits
//! only for tasks actually started. [`ThreadPool::run_chunks`] is the primitive;
//! [`ThreadPool::run`] keeps the `(thread_idx, n_threads)` form (each index is one task, run
//! by whichever thread claims it), and [`ThreadPool::for_each_chunk_mut`] /
//! [`ThreadPool::for_each_mut`] hand out disjoint `&mut` pieces of an output safely
//! ([`pieces`] + [`ThreadPool::for_each_task`] for strided sets of rows;
//! [`ThreadPool::for_each_task_with`] adds per-thread scratch).
//!
//! ```
//! use damascus_kernels::pool::ThreadPool;
//! let pool = ThreadPool::new(2);
//! let mut out = vec![0usize; 100]; // [100] written in chunks of 8
//! pool.for_each_chunk_mut(&mut out, 8, &|c, chunk| {
//!     for (i, o) in chunk.iter_mut().enumerate() {
//!         *o = c * 8 + i;
//!     }
//! });
//! assert_eq!(out.iter().sum::<usize>(), 4950);
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

/// Bits of the state word holding the next task and the task count (the rest: generation).
const IDX_BITS: u32 = 20;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;
/// Most tasks one fork/join hands out; [`ThreadPool::run_chunks`] groups larger counts.
pub const MAX_TASKS: usize = IDX_MASK as usize;

type Job = *const (dyn Fn(usize) + Sync + 'static);

/// `generation << 40 | n_tasks << 20 | next_task`.
fn pack(generation: u64, n: u64, next: u64) -> u64 {
    (generation << (2 * IDX_BITS)) | (n << IDX_BITS) | next
}

fn unpack(s: u64) -> (u64, u64, u64) {
    (
        s >> (2 * IDX_BITS),
        (s >> IDX_BITS) & IDX_MASK,
        s & IDX_MASK,
    )
}

struct Shared {
    /// The current job; written by the caller of `run_chunks` only while no task of the
    /// previous job is unfinished, read by a thread only after it has claimed a task of the
    /// current generation (and so before that generation can end).
    job: UnsafeCell<Job>,
    n_threads: usize,
    /// [`pack`]ed generation, task count and next unclaimed task.
    state: AtomicU64,
    /// Tasks of the current generation finished.
    done: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written by the single `run_chunks` in progress (guarded by
// `ThreadPool::busy`) after every task of the previous generation is done, and published by
// a SeqCst store of `state`; a thread dereferences it only after a successful CAS claiming a
// task of that generation, and the generation (and the job's lifetime) cannot end before
// that task is counted in `done`. All other fields are Sync.
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced under the protocol above.
unsafe impl Send for Shared {}

impl Shared {
    /// Claims and runs tasks of generation `g` until none is left (or the generation has
    /// moved on). Returns without touching the job when nothing could be claimed.
    fn work_on(&self, g: u64) {
        let mut s = self.state.load(Ordering::SeqCst);
        loop {
            let (sg, n, next) = unpack(s);
            if sg != g || next >= n {
                return;
            }
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    // SAFETY: we hold task `next` of generation `g`, so the job stored for
                    // `g` stays alive until we count it in `done` below.
                    let job = unsafe { &**self.job.get() };
                    if catch_unwind(AssertUnwindSafe(|| job(next as usize))).is_err() {
                        self.panicked.store(true, Ordering::SeqCst);
                    }
                    self.done.fetch_add(1, Ordering::Release);
                    s = self.state.load(Ordering::SeqCst);
                }
                Err(cur) => s = cur,
            }
        }
    }
}

/// A fixed set of worker threads executing jobs of independent tasks.
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

/// A thread count above what the machine offers, and what it was lowered to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadClamp {
    /// The count asked for.
    pub requested: usize,
    /// The count used: the logical CPUs this process may run on.
    pub used: usize,
}

impl std::fmt::Display for ThreadClamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "-t {} is more than the {} CPUs this process may use; using {}",
            self.requested, self.used, self.used
        )
    }
}

impl ThreadPool {
    /// A pool of exactly `n_threads` (≥ 1; the caller of a job takes part, so
    /// `n_threads - 1` OS threads are spawned). User-facing counts go through
    /// [`ThreadPool::clamped`].
    pub fn new(n_threads: usize) -> ThreadPool {
        let n = n_threads.max(1);
        let noop: &'static (dyn Fn(usize) + Sync) = &|_| {};
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(noop as Job),
            n_threads: n,
            state: AtomicU64::new(0),
            done: AtomicUsize::new(0),
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
                    .spawn(move || worker(&s))
                    .expect("spawning a pool worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            busy: AtomicBool::new(false),
            handles,
        }
    }

    /// A pool of `requested` threads, or of the logical CPUs this process may run on where
    /// that is fewer (more threads than CPUs only take turns, and `-t 10000` must not start
    /// ten thousand threads); the clamp, if any, is returned for the caller to report.
    pub fn clamped(requested: usize) -> (ThreadPool, Option<ThreadClamp>) {
        let max = usable_cpus();
        let used = requested.clamp(1, max);
        let clamp = (requested > max).then_some(ThreadClamp { requested, used });
        (ThreadPool::new(used), clamp)
    }

    /// A pool sized to the physical cores of this machine.
    pub fn with_physical_cores() -> ThreadPool {
        ThreadPool::new(physical_cores())
    }

    /// Number of threads taking part in each job (including the caller).
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(thread_idx, n_threads)` for every `thread_idx` in `0..n_threads` and returns
    /// when all are done. Each index is one task run exactly once, by whichever thread claims
    /// it (the caller included), so `f` must not depend on which OS thread runs it. A panic in
    /// any task is re-raised here after all started tasks have finished. Re-entrant or
    /// concurrent calls run every index serially on the calling thread.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.shared.n_threads;
        self.run_chunks(n, &|t| f(t, n));
    }

    /// Runs `f(chunk)` exactly once for every `chunk` in `0..n_chunks`, the chunks handed out
    /// one at a time to whichever thread is free (the caller included), and returns when all
    /// are done. A thread that is late (descheduled) delays the job by at most the chunk it
    /// holds. Panics and re-entrant calls as for [`ThreadPool::run`].
    pub fn run_chunks(&self, n_chunks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_chunks > MAX_TASKS {
            // Tasks of several consecutive chunks each.
            let per = n_chunks.div_ceil(MAX_TASKS);
            let n_tasks = n_chunks.div_ceil(per);
            return self.run_chunks(n_tasks, &|task| {
                (task * per..((task + 1) * per).min(n_chunks)).for_each(f)
            });
        }
        if self.shared.n_threads == 1 || n_chunks <= 1 {
            return (0..n_chunks).for_each(f);
        }
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return (0..n_chunks).for_each(f);
        }
        let s = &*self.shared;
        // SAFETY: erasing the lifetime is sound because this function does not return before
        // every task is done (`done == n_chunks`, waited for below; tasks never unwind out of
        // `work_on`), and no thread dereferences the job without holding an unfinished task.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        let (g, _, _) = unpack(s.state.load(Ordering::SeqCst));
        let g = (g + 1) & ((1 << (64 - 2 * IDX_BITS)) - 1);
        // SAFETY: we hold `busy` and every task of the previous generation is done, so no
        // thread reads `job` now (claims of the old generation fail: its tasks are all taken).
        unsafe { *s.job.get() = job };
        s.done.store(0, Ordering::SeqCst);
        s.state.store(pack(g, n_chunks as u64, 0), Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        s.work_on(g);
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) != n_chunks {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        self.busy.store(false, Ordering::Release);
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a thread-pool task panicked");
        }
    }

    /// Runs `f(i, chunk)` over `data` cut into consecutive chunks of `chunk_len` elements
    /// (the last may be shorter), each chunk exactly once, handed out as by
    /// [`ThreadPool::run_chunks`].
    pub fn for_each_chunk_mut<T: Send>(
        &self,
        data: &mut [T],
        chunk_len: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        self.for_each_mut(data.chunks_mut(chunk_len.max(1)).collect(), f);
    }

    /// Runs `f(i, pieces[i])` for every piece, each exactly once, handed out as by
    /// [`ThreadPool::run_chunks`]: the safe way to let tasks write disjoint parts of one or
    /// several outputs (cut them with `chunks_mut` / `split_at_mut` first).
    pub fn for_each_mut<T: Send>(
        &self,
        pieces: Vec<&mut [T]>,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        self.for_each_task(pieces, &|i, p| f(i, p));
    }

    /// Runs `f(i, tasks[i])` for every task, each moved into exactly one call, handed out as
    /// by [`ThreadPool::run_chunks`]. A task may hold several `&mut` pieces (a gate chunk and
    /// its up chunk, a buffer and its row range).
    pub fn for_each_task<P: Send>(&self, tasks: Vec<P>, f: &(dyn Fn(usize, P) + Sync)) {
        let slots = Slots::new(tasks);
        let slots = &slots;
        self.run_chunks(slots.0.len(), &|i| {
            // SAFETY: `run_chunks` runs index `i` exactly once, so this is slot `i`'s only use.
            if let Some(p) = unsafe { slots.take(i) } {
                f(i, p)
            }
        });
    }

    /// [`ThreadPool::for_each_task`] with per-thread scratch: every thread that takes a task
    /// builds one `S` with `init` (lazily, at its first task) and passes it to each task it
    /// runs, `f(i, tasks[i], &mut scratch)`. Tasks are claimed in index order through one
    /// atomic counter, so put the heaviest first. For kernels whose units need large scratch
    /// buffers (key blocks, panels, tile configurations) that a per-task allocation would
    /// waste; `f`'s result must not depend on what earlier tasks left in the scratch.
    pub fn for_each_task_with<P: Send, S>(
        &self,
        tasks: Vec<P>,
        init: &(dyn Fn() -> S + Sync),
        f: &(dyn Fn(usize, P, &mut S) + Sync),
    ) {
        let slots = Slots::new(tasks);
        let n = slots.0.len();
        let next = AtomicUsize::new(0);
        let work = |_: usize, _: usize| {
            let mut scratch: Option<S> = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                // SAFETY: `next` hands out every index once, so this is slot `i`'s only use.
                if let Some(p) = unsafe { slots.take(i) } {
                    f(i, p, scratch.get_or_insert_with(init));
                }
            }
        };
        if n > 1 {
            self.run(&work);
        } else {
            work(0, 1);
        }
    }
}

/// `data` cut into consecutive pieces of `len` elements (the last may be shorter), each in an
/// `Option` so that tasks can [`Option::take`] the pieces they own: the safe way to give one
/// task a strided set of rows of an output (a token tile's rows of one head, a query block's
/// columns of one head) for [`ThreadPool::for_each_task`].
pub fn pieces<T>(data: &mut [T], len: usize) -> Vec<Option<&mut [T]>> {
    data.chunks_mut(len.max(1)).map(Some).collect()
}

/// Tasks moved one each into the threads that claim them.
struct Slots<P>(Vec<UnsafeCell<Option<P>>>);

// SAFETY: a slot is only touched through `take`, whose callers guarantee that each index is
// taken by one thread; `P: Send` lets its value move to that thread.
unsafe impl<P: Send> Sync for Slots<P> {}

impl<P> Slots<P> {
    fn new(tasks: Vec<P>) -> Self {
        Slots(
            tasks
                .into_iter()
                .map(|t| UnsafeCell::new(Some(t)))
                .collect(),
        )
    }

    /// Moves task `i` out.
    ///
    /// # Safety
    /// No other thread accesses slot `i` during or after the call.
    unsafe fn take(&self, i: usize) -> Option<P> {
        // SAFETY: exclusive access to slot `i`, as the caller guarantees.
        unsafe { (*self.0[i].get()).take() }
    }
}

fn worker(s: &Shared) {
    // Generation 0 is the pool's initial, empty one (a worker may start after the first job).
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        let g = loop {
            let g = unpack(s.state.load(Ordering::SeqCst)).0;
            if g != seen {
                break g;
            }
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) || start.elapsed() < SPIN_FOR {
                std::hint::spin_loop();
                continue;
            }
            let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while unpack(s.state.load(Ordering::SeqCst)).0 == seen
                && !s.shutdown.load(Ordering::SeqCst)
            {
                guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        };
        seen = g;
        s.work_on(g);
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

/// How many units of `align` items go into one chunk when `n` items are handed out over
/// `nt` threads: about eight chunks per thread (a late thread costs an eighth of its even
/// share), never less than `align` items, always a multiple of `align`.
pub fn chunk_len(n: usize, align: usize, nt: usize) -> usize {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let per = units.div_ceil(8 * nt.max(1)).max(1);
    per * align
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

/// Logical CPUs this process may run on (its affinity mask; falls back to the machine's).
pub fn usable_cpus() -> usize {
    let info = crate::cpu::CpuInfo::gather();
    info.usable_threads
        .or(info.threads)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
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

    #[test]
    fn every_chunk_runs_exactly_once() {
        let pool = ThreadPool::new(3);
        for n in [0, 1, 2, 3, 7, 33, 1023] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run_chunks(n, &|c| {
                hits[c].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
        // More chunks than one job's task word holds: grouped, still each once.
        let n = MAX_TASKS + 5;
        let sum = AtomicUsize::new(0);
        let count = AtomicUsize::new(0);
        pool.run_chunks(n, &|c| {
            sum.fetch_add(c, Ordering::Relaxed);
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.into_inner(), n);
        assert_eq!(sum.into_inner(), n * (n - 1) / 2);
    }

    #[test]
    fn chunks_match_a_serial_pass_bit_for_bit() {
        // A chunk's result depends only on its index, never on the thread that ran it.
        let pool = ThreadPool::new(4);
        let x: Vec<f32> = (0..1023).map(|i| (i as f32 * 0.37).sin()).collect();
        let f = |c: usize, out: &mut [f32]| {
            for (i, o) in out.iter_mut().enumerate() {
                let j = c * 7 + i;
                *o = x[..=j].iter().fold(0.0f32, |a, &v| a * 0.999 + v * v);
            }
        };
        let mut serial = vec![0f32; x.len()];
        for (c, chunk) in serial.chunks_mut(7).enumerate() {
            f(c, chunk);
        }
        for _ in 0..5 {
            let mut par = vec![0f32; x.len()];
            pool.for_each_chunk_mut(&mut par, 7, &f);
            assert!(
                par.iter()
                    .zip(&serial)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
        }
    }

    #[test]
    fn a_blocked_worker_does_not_hold_up_the_job() {
        // Chunk 0 waits until every other chunk is done: with fixed shares the thread holding
        // it would own half the chunks and this would deadlock; handed out, the other thread
        // (or the caller) takes them all.
        let pool = ThreadPool::new(2);
        let n = 64;
        let done = AtomicUsize::new(0);
        pool.run_chunks(n, &|c| {
            if c == 0 {
                let t0 = Instant::now();
                while done.load(Ordering::Acquire) < n - 1 {
                    assert!(
                        t0.elapsed() < Duration::from_secs(10),
                        "chunks were not taken"
                    );
                    std::thread::yield_now();
                }
            }
            done.fetch_add(1, Ordering::Release);
        });
        assert_eq!(done.into_inner(), n);
    }

    #[test]
    fn for_each_mut_writes_disjoint_pieces_of_several_outputs() {
        let pool = ThreadPool::new(3);
        let (mut a, mut b) = (vec![0u32; 100], vec![0u32; 37]);
        let mut pieces: Vec<&mut [u32]> = a.chunks_mut(16).collect();
        pieces.extend(b.chunks_mut(5));
        pool.for_each_mut(pieces, &|i, p| p.fill(i as u32 + 1));
        assert_eq!(a[0], 1);
        assert_eq!(a[99], 7);
        assert_eq!(b[0], 8);
        assert_eq!(b[36], 15);
    }

    #[test]
    fn tasks_with_scratch_run_once_each_and_match_a_serial_pass() {
        let pool = ThreadPool::new(3);
        for n in [0, 1, 3, 7, 33, 1023] {
            let mut out = vec![0u64; 2 * n]; // [n, 2]: each task owns column 0 of row i, col 1 of row n-1-i
            let mut rows = pieces(&mut out, 1);
            let tasks: Vec<(usize, Vec<&mut [u64]>)> = (0..n)
                .map(|i| {
                    let mine = [2 * i, 2 * (n - 1 - i) + 1];
                    (i, mine.iter().filter_map(|&j| rows[j].take()).collect())
                })
                .collect();
            let inits = AtomicUsize::new(0);
            pool.for_each_task_with(
                tasks,
                &|| {
                    inits.fetch_add(1, Ordering::Relaxed);
                    Vec::<u64>::new()
                },
                &|i, (j, mine), scratch| {
                    assert_eq!(i, j);
                    scratch.clear();
                    scratch.extend((0..=i as u64).map(|x| x * x));
                    for p in mine {
                        p[0] += scratch.iter().sum::<u64>() + 1;
                    }
                },
            );
            let want: Vec<u64> = (0..2 * n)
                .map(|j| {
                    let i = if j % 2 == 0 { j / 2 } else { n - 1 - j / 2 };
                    (0..=i as u64).map(|x| x * x).sum::<u64>() + 1
                })
                .collect();
            assert_eq!(out, want, "n = {n}");
            assert!(inits.into_inner() <= 3);
        }
    }

    #[test]
    fn thread_counts_above_the_cpus_are_clamped() {
        let (pool, clamp) = ThreadPool::clamped(10_000);
        assert_eq!(pool.n_threads(), usable_cpus());
        let c = clamp.expect("10000 threads is more than this machine has");
        assert_eq!(c.requested, 10_000);
        assert!(c.to_string().contains("10000"));
        let (pool, clamp) = ThreadPool::clamped(1);
        assert_eq!((pool.n_threads(), clamp), (1, None));
    }

    #[test]
    fn chunk_len_is_aligned_and_small() {
        assert_eq!(chunk_len(3072, 32, 2), 192);
        assert_eq!(chunk_len(10, 16, 4), 16);
        assert_eq!(chunk_len(0, 1, 2), 1);
    }
}
