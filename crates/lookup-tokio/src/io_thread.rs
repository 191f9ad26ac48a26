//! The scheduling policy of the threads that run the I/O task: a woken I/O thread
//! must not take the CPU from the scheduler's thread.
//!
//! Each scheduler step hands its new lookups to the I/O task once (one channel send,
//! one wake-up). Under Linux's default policy (`SCHED_OTHER`), a thread woken while
//! every core is busy may preempt the thread that woke it: the I/O task then encodes
//! and sends the step's RPCs on the scheduler's core, inside the scheduler's step.
//! The kernel does not preempt a running thread at the wake-up of a `SCHED_BATCH`
//! one (see sched(7)); the woken I/O thread runs on an idle core, or at the running
//! thread's next tick or sleep (the model's forward pass). Its nice value, and so its
//! share of a busy CPU, is unchanged.
//!
//! The Python package's runtime applies [`set_batch_policy`] to each of its threads
//! (`on_thread_start`), and opens each client's ZeroMQ socket from a thread under it
//! (libzmq's I/O threads, started by the first socket, inherit the policy); a Rust
//! caller that runs the client on a runtime of its own can do the same with its I/O
//! runtime's builder:
//!
//! ```no_run
//! let io = tokio::runtime::Builder::new_multi_thread()
//!     .worker_threads(1)
//!     .on_thread_start(|| {
//!         let _ = lookup_tokio::io_thread::set_batch_policy();
//!     })
//!     .enable_all()
//!     .build()?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;

/// Puts the calling thread under `SCHED_BATCH` with its nice value unchanged, so
/// that its wake-up does not preempt a running thread (module docs). Threads it
/// creates afterwards inherit the policy.
///
/// Errors: the OS refused (`io::Error` with the OS code; an unprivileged thread may
/// always move itself from `SCHED_OTHER` to `SCHED_BATCH`), or the thread's nice
/// value could not be read from `/proc/thread-self/stat`. On systems other than
/// Linux it does nothing and returns `Ok(())`.
#[cfg(target_os = "linux")]
pub fn set_batch_policy() -> io::Result<()> {
    use thread_priority::unix::{
        NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
        thread_native_id,
    };
    use thread_priority::{ThreadPriority, ThreadPriorityValue};

    let batch = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch);
    let nice = current_nice()?;
    // For the normal policies the crate sets the nice value too, named on its 0-99
    // scale: the point of that scale whose nice value is the thread's own (any
    // thread may set its own nice value again).
    let own = (*ThreadPriorityValue::MIN..=*ThreadPriorityValue::MAX)
        .filter_map(|p| ThreadPriorityValue::try_from(p).ok())
        .map(ThreadPriority::Crossplatform)
        .find(|p| p.to_posix(batch).is_ok_and(|n| n == nice))
        .ok_or_else(|| io::Error::other(format!("nice value {nice} has no priority")))?;
    set_thread_priority_and_policy(thread_native_id(), own, batch)
        .map_err(|e| io::Error::other(format!("cannot set SCHED_BATCH: {e:?}")))
}

/// See the Linux version: elsewhere there is no such policy, and nothing is done.
#[cfg(not(target_os = "linux"))]
pub fn set_batch_policy() -> io::Result<()> {
    Ok(())
}

/// True when the calling thread runs under `SCHED_BATCH` (always false off Linux).
///
/// Errors: the OS refused to say (`pthread_getschedparam`).
pub fn is_batch_policy() -> io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::unix::{
            NormalThreadSchedulePolicy, ThreadSchedulePolicy, thread_schedule_policy,
        };
        let policy = thread_schedule_policy()
            .map_err(|e| io::Error::other(format!("cannot read the policy: {e:?}")))?;
        Ok(policy == ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch))
    }
    #[cfg(not(target_os = "linux"))]
    Ok(false)
}

/// The calling thread's nice value: field 19 of `/proc/thread-self/stat` (proc(5)),
/// counted after the command name's closing parenthesis (the name may hold spaces).
#[cfg(target_os = "linux")]
fn current_nice() -> io::Result<i32> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    parse_nice(&stat).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "no nice value in /proc/thread-self/stat",
        )
    })
}

/// Field 19 (nice) of a `/proc/<pid>/stat` line; `None` if the line is not one.
#[cfg(any(target_os = "linux", test))]
fn parse_nice(stat: &str) -> Option<i32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name; nice is field 19, the 17th of those.
    after_name.split_ascii_whitespace().nth(16)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_nice_reads_field_19_past_a_name_with_spaces() {
        let stat = "4686 (a (b) c) S 1 4686 4686 0 -1 4194304 100 0 0 0 5 6 0 0 20 7 3 0 1";
        assert_eq!(parse_nice(stat), Some(7));
        assert_eq!(parse_nice("4686 (python) S 1 2"), None);
        assert_eq!(parse_nice("no name here"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_moves_itself_to_batch_and_keeps_its_nice_value() {
        std::thread::spawn(|| {
            let nice = current_nice().unwrap();
            assert!(
                !is_batch_policy().unwrap(),
                "a new thread starts as SCHED_OTHER"
            );
            set_batch_policy().unwrap();
            assert!(is_batch_policy().unwrap());
            assert_eq!(current_nice().unwrap(), nice);
            // Twice is the same.
            set_batch_policy().unwrap();
            assert!(is_batch_policy().unwrap());
        })
        .join()
        .unwrap();
        assert!(
            !is_batch_policy().unwrap(),
            "only the thread that asked changed"
        );
        // A thread at another nice value keeps it (raising one's own nice value needs
        // no privilege): 19, the crate's lowest priority under the normal policy.
        std::thread::spawn(|| {
            use thread_priority::unix::{
                NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
                thread_native_id,
            };
            set_thread_priority_and_policy(
                thread_native_id(),
                thread_priority::ThreadPriority::Min,
                ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Other),
            )
            .unwrap();
            assert_eq!(current_nice().unwrap(), 19);
            set_batch_policy().unwrap();
            assert!(is_batch_policy().unwrap());
            assert_eq!(current_nice().unwrap(), 19);
            // A thread it starts inherits both.
            let got = std::thread::spawn(|| (is_batch_policy().unwrap(), current_nice().unwrap()))
                .join()
                .unwrap();
            assert_eq!(got, (true, 19));
        })
        .join()
        .unwrap();
    }
}
