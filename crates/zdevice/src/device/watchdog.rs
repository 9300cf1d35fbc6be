//! One long-lived worker thread that runs the driver calls which may block inside the driver,
//! so the calling thread can give up at a deadline. Started on first use; ends when the device
//! (the sender) goes away. A call that never returns leaves the worker stuck, but by then the
//! device is marked lost and nothing more is submitted.

use std::sync::Mutex;
use std::sync::mpsc::{Sender, channel};

pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    jobs: Mutex<Option<Sender<Job>>>,
}

impl Watchdog {
    /// Queues `job` on the worker, starting it if needed.
    pub(crate) fn submit(&self, job: Job) -> Result<(), String> {
        let mut jobs = self
            .jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if jobs.is_none() {
            let (tx, rx) = channel::<Job>();
            std::thread::Builder::new()
                .name("zdevice-blocking-calls".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .map_err(|e| format!("could not start the watchdog worker: {e}"))?;
            *jobs = Some(tx);
        }
        match jobs.as_ref() {
            Some(tx) => tx
                .send(job)
                .map_err(|_| "the watchdog worker has stopped".to_string()),
            None => Err("the watchdog worker is missing".to_string()),
        }
    }
}
