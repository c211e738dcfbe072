//! The worker pool shared by all request queues, and `Job`: a popped request's place on
//! its ring, which its reply needs wherever it is served.

use std::borrow::Borrow;
use std::io;
use std::sync::Arc;
use std::thread;

use log::error;

use super::vring::{Ticket, WaitPlace};
use super::{Chain, FuseServer, TrackedVring};
use crate::server::{Deferred, GuestMem, Slot};

/// A popped request's place on its ring: the ring, its ticket, its chain's head and its
/// queue. `R` is the ring owned (a pool job, an answer left for later) or borrowed (a
/// request the queue thread serves, which costs no clone of the ring).
pub(super) struct Job<R: Borrow<TrackedVring> = TrackedVring> {
    pub vring: R,
    pub ticket: Ticket,
    pub head: u16,
    pub queue: u16,
}

impl<R: Borrow<TrackedVring>> Job<R> {
    fn ring(&self) -> &TrackedVring {
        self.vring.borrow()
    }

    fn owned(&self) -> Job {
        Job {
            vring: self.ring().clone(),
            ticket: self.ticket,
            head: self.head,
            queue: self.queue,
        }
    }

    /// The request answered after its server moved on (`server::Deferred`): a lock wait,
    /// holding a place of its ring's share for lock waits until it is answered or
    /// suspended. None when lock waits hold their share of the ring already
    /// (`vring::wait_place`).
    pub fn later(&self) -> Option<Box<dyn Deferred>> {
        let place = self.ring().wait_place(self.head)?;
        Some(Box::new(Later {
            job: self.owned(),
            place,
        }))
    }

    /// Puts the reply of `len` bytes on the used ring; None: answered later, or not at all.
    pub fn complete(&self, len: Option<u32>) {
        if let Some(len) = len {
            self.ring().complete(&[(self.ticket, self.head, len)]);
        }
    }

    /// Whether the ring stopped since the request was popped: then it is dropped
    /// unserved (`stopped_since_popped`).
    pub fn stopped(&self) -> bool {
        stopped_since_popped(self.ring(), self.head, self.ticket)
    }
}

/// A request answered after its worker moved on (`Job::later`).
struct Later {
    job: Job,
    place: WaitPlace,
}

impl Deferred for Later {
    fn finish(self: Box<Self>, write: &mut dyn FnMut(&GuestMem) -> u32) {
        let Later { job, place } = *self;
        // Given back before the reply shows: a guest that sends its next wait on seeing
        // this one answered finds the place free.
        drop(place);
        job.vring.complete_with(job.ticket, job.head, write);
    }

    fn on_stop(&self, suspend: Box<dyn Fn() + Send + Sync>) -> bool {
        self.job.vring.on_stop(self.job.ticket, suspend)
    }

    fn slot(&self) -> Slot {
        Slot {
            queue: self.job.queue,
            head: self.job.head,
            position: self.job.ticket.position(),
        }
    }

    fn suspend(self: Box<Self>) {
        let Later { job, place } = *self;
        // Given back before the ring hears of it, as in `finish`: the wait is taken up
        // again, with a place of its own, when the ring runs again.
        drop(place);
        job.vring.forget(job.ticket);
    }
}

/// Worker threads shared by all request queues.
pub(super) struct Pool {
    tx: crossbeam_channel::Sender<(Job, Chain)>,
}

impl Pool {
    pub fn new(size: usize, server: Arc<FuseServer>) -> io::Result<Pool> {
        let (tx, rx) = crossbeam_channel::unbounded::<(Job, Chain)>();
        for i in 0..size {
            let rx = rx.clone();
            let server = server.clone();
            thread::Builder::new()
                .name(format!("vfsd-worker-{i}"))
                .spawn(move || {
                    for (job, chain) in rx {
                        if job.stopped() {
                            continue;
                        }
                        let mem = chain.memory().clone();
                        job.complete(server.handle(&mem, chain, &mut || job.later()));
                    }
                })?;
        }
        Ok(Pool { tx })
    }

    /// Hands `chain` to the workers.
    pub fn send<R: Borrow<TrackedVring>>(&self, mut chain: Chain, job: &Job<R>) {
        // What waits for a worker stays small (`Popped::park`).
        chain.park();
        if self.tx.send((job.owned(), chain)).is_err() {
            error!("worker pool is gone");
        }
    }

    /// Requests handed to the pool that no worker has taken yet.
    pub fn queued(&self) -> usize {
        self.tx.len()
    }
}

/// Whether the ring stopped (GET_VRING_BASE, a reset) after the request at `head` was
/// popped, while the queue thread served the requests before it or the job waited for a
/// worker: then it is dropped unserved (`complete` drops it). Served anyway, it would act
/// on the host after the stop and write its reply into memory the guest may have reused,
/// and after a resume it is popped again and would run twice (a FORGET applied twice).
pub(super) fn stopped_since_popped(vring: &TrackedVring, head: u16, t: Ticket) -> bool {
    if vring.is_current(t) {
        return false;
    }
    vring.complete(&[(t, head, 0)]);
    true
}
