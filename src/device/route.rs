//! Where each request runs: the one place that decides it.
//!
//! - **On the queue thread, without blocking**: a READ first tries to be answered there
//!   (`FuseServer::try_handle_without_blocking`: the page cache has the data, so no
//!   worker hand-off).
//! - **On the queue thread**: a lone request, when the guest waits for each reply before
//!   it sends the next (`Lone`) and the opcode is short (`Opcode::is_short`), or a READ
//!   that would block in that case.
//! - **In the worker pool**: everything else.
//! - **On a lock waiter**: not decided here. A SETLKW that must wait moves from wherever
//!   it runs to a thread of its own (`server::locks`, answered through a `Deferred`).
//!
//! docs/design.md ("Lone requests", "The read fast path") gives the figures behind it.

use std::sync::atomic::{AtomicU32, Ordering};

use super::Chain;
use crate::server::{FuseServer, GuestMem};

/// Pops in a row that found one request and nothing else in flight before the queue
/// thread serves such requests itself. A guest with parallel work often leaves the queue
/// with one request for a moment (the load generator at 8 in flight: a pop in seven), and
/// serving those on the queue thread cost it 7-13%; 16 in a row is a guest waiting on
/// each reply.
pub const LONE_POPS: u32 = 16;

/// Where a request runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A READ: tried on the queue thread without blocking, then `if_it_would_block`.
    NoWaitRead {
        if_it_would_block: Fallback,
    },
    /// Served on the queue thread, blocking if it must.
    QueueThread,
    Pool,
}

/// Where a no-wait READ that would block goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    QueueThread,
    Pool,
}

/// Per queue: how many pops in a row found one request and nothing else in flight.
pub struct Lone {
    pops: Vec<AtomicU32>,
}

impl Lone {
    pub fn new(queues: usize) -> Lone {
        Lone {
            pops: (0..queues).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// After a pop of `popped` requests with `in_flight` requests of the queue not yet
    /// answered (these included): whether the guest is waiting on one request at a time.
    /// Any sign of parallel work starts the count again.
    pub fn observe(&self, queue: usize, popped: usize, in_flight: usize) -> bool {
        let pops = &self.pops[queue];
        match popped {
            0 => false, // a wake-up with nothing new says nothing
            1 if in_flight == 1 => pops.fetch_add(1, Ordering::Relaxed) >= LONE_POPS,
            _ => {
                pops.store(0, Ordering::Relaxed);
                false
            }
        }
    }

    /// The guest sent more while a lone request was served: it has several in flight.
    pub fn busy(&self, queue: usize) {
        self.pops[queue].store(0, Ordering::Relaxed);
    }
}

/// Where `chain` runs, given whether its queue is `alone` (`Lone::observe`). The opcode
/// is read from the guest's buffer, only a hint: what is served is decided on the
/// request's one copy (a guest that rewrites it in between only slows its own queue).
pub fn place(server: &FuseServer, mem: &GuestMem, chain: &Chain, alone: bool) -> Place {
    if server.is_read(mem, chain) {
        Place::NoWaitRead {
            if_it_would_block: if alone {
                Fallback::QueueThread
            } else {
                Fallback::Pool
            },
        }
    } else if alone && server.is_short(mem, chain) {
        Place::QueueThread
    } else {
        Place::Pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_is_alone_after_lone_pops_in_a_row_and_not_after_a_sign_of_parallel_work() {
        let lone = Lone::new(2);
        for _ in 0..LONE_POPS {
            assert!(!lone.observe(1, 1, 1));
        }
        assert!(lone.observe(1, 1, 1));
        assert!(!lone.observe(0, 1, 1), "queues count apart");
        assert!(
            !lone.observe(1, 0, 0) && lone.observe(1, 1, 1),
            "an empty wake-up says nothing"
        );
        assert!(!lone.observe(1, 1, 2), "another request in flight");
        assert!(!lone.observe(1, 1, 1), "which starts the count again");
        for _ in 0..LONE_POPS {
            lone.observe(1, 1, 1);
        }
        lone.busy(1);
        assert!(!lone.observe(1, 1, 1), "busy starts it again");
    }
}
