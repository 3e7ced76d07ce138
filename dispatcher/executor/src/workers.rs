//! The threads that run requests: kept and reused instead of one new thread per request.
//!
//! Why: a thread per request cost, on every `cmd.run` and `fs.*` call, a `clone`, the mapping of
//! a 2 MiB stack with its guard page, and at the thread's exit the unmapping of that stack: in a
//! process whose other threads run on other CPUs that unmapping shoots down their TLBs. A
//! request handed to an idle thread costs one channel send.
//!
//! How: an idle worker waits on its own channel and is listed in `idle`; [`Workers::run`] pops
//! one and sends it the job, or starts a new worker with the job when none is idle (so a job
//! never waits behind another: how many run at once stays bounded by the server's in-flight
//! limit, not here). At most [`MAX_IDLE`] wait; a worker idle for [`IDLE_EXIT`] leaves, unless a job was handed to it in
//! the meantime; so does a worker whose job panicked, because a job may have changed the
//! thread's own credentials (`identity::as_sandbox_user`) and not restored them. Threads are
//! started from the thread that calls [`Workers::run`], so they inherit its per-thread
//! credentials (filesystem ids, capabilities), as the per-request threads did.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long an idle worker waits for a job before it ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(10);
/// Most idle workers kept; more end as soon as they are done. Small, because every thread
/// counts against the container's pids limit, which the agent's commands need: after a burst
/// of parallel calls at most this many threads stay, and only for [`IDLE_EXIT`].
pub const MAX_IDLE: usize = 8;

/// One unit of work.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool; cheap to share.
#[derive(Clone, Default)]
pub struct Workers {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Idle workers, each by its number and the sending end of its channel.
    idle: Mutex<Vec<(u64, Sender<Job>)>>,
    /// Numbers for new workers.
    next: Mutex<u64>,
}

impl Workers {
    /// Runs `job` on an idle worker, or on a new one; an error only when no thread can be
    /// started (the job is then dropped unrun).
    pub fn run(&self, job: Job) -> std::io::Result<()> {
        let mut job = job;
        loop {
            let idle = self.lock_idle().pop();
            let Some((_, worker)) = idle else { break };
            // A worker ends only after taking itself off the list (or after a panic, which
            // drops its receiver): a failed send gives the job back to try the next one.
            match worker.send(job) {
                Ok(()) => return Ok(()),
                Err(returned) => job = returned.0,
            }
        }
        self.start(job)
    }

    fn start(&self, first: Job) -> std::io::Result<()> {
        let number = {
            let mut next = self
                .shared
                .next
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *next += 1;
            *next
        };
        let (sender, receiver) = mpsc::channel();
        let shared = Arc::clone(&self.shared);
        std::thread::Builder::new()
            .name("request".to_owned())
            .spawn(move || work(&shared, number, &sender, &receiver, first))
            .map(drop)
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Sender<Job>)>> {
        self.shared
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How many workers wait for a job now.
    pub fn idle(&self) -> usize {
        self.lock_idle().len()
    }
}

/// A worker's life: its first job, then the jobs handed to it while it is listed idle.
fn work(shared: &Shared, number: u64, sender: &Sender<Job>, receiver: &Receiver<Job>, first: Job) {
    let mut job = first;
    loop {
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            return;
        }
        {
            let mut idle = shared.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() >= MAX_IDLE {
                return;
            }
            idle.push((number, sender.clone()));
        }
        job = match receiver.recv_timeout(IDLE_EXIT) {
            Ok(next) => next,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let mut idle = shared.idle.lock().unwrap_or_else(PoisonError::into_inner);
                match idle.iter().position(|(n, _)| *n == number) {
                    Some(at) => {
                        idle.swap_remove(at);
                        return;
                    }
                    // Taken off the list by `run`, whose job is on its way.
                    None => {
                        drop(idle);
                        match receiver.recv() {
                            Ok(next) => next,
                            Err(_) => return,
                        }
                    }
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn wait_until(what: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !what() {
            assert!(std::time::Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_finished_worker_runs_the_next_job_on_the_same_thread() {
        let workers = Workers::default();
        let (tx, rx) = mpsc::channel();
        let first = tx.clone();
        workers
            .run(Box::new(move || {
                first.send(std::thread::current().id()).unwrap();
            }))
            .unwrap();
        let one = rx.recv().unwrap();
        wait_until(|| workers.idle() == 1);
        workers
            .run(Box::new(move || {
                tx.send(std::thread::current().id()).unwrap();
            }))
            .unwrap();
        assert_eq!(rx.recv().unwrap(), one);
    }

    #[test]
    fn a_job_never_waits_behind_a_busy_one() {
        let workers = Workers::default();
        let (release, blocked) = mpsc::channel::<()>();
        workers
            .run(Box::new(move || {
                let _ = blocked.recv();
            }))
            .unwrap();
        let (tx, rx) = mpsc::channel();
        workers.run(Box::new(move || tx.send(()).unwrap())).unwrap();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the second job ran while the first was busy");
        release.send(()).unwrap();
    }

    #[test]
    fn a_worker_whose_job_panicked_is_not_reused() {
        let workers = Workers::default();
        let (tx, rx) = mpsc::channel();
        workers
            .run(Box::new(move || {
                tx.send(std::thread::current().id()).unwrap();
                panic!("a job that fails");
            }))
            .unwrap();
        let panicked = rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(workers.idle(), 0);
        let (tx, rx) = mpsc::channel();
        workers
            .run(Box::new(move || {
                tx.send(std::thread::current().id()).unwrap()
            }))
            .unwrap();
        assert_ne!(rx.recv().unwrap(), panicked);
    }

    #[test]
    fn many_jobs_at_once_all_run() {
        let workers = Workers::default();
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..200 {
            let done = Arc::clone(&done);
            workers
                .run(Box::new(move || {
                    std::thread::sleep(Duration::from_millis(1));
                    done.fetch_add(1, Ordering::SeqCst);
                }))
                .unwrap();
        }
        wait_until(|| done.load(Ordering::SeqCst) == 200);
        assert!(workers.idle() <= MAX_IDLE);
    }
}
