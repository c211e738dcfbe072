//! SET_DEVICE_STATE_FD and CHECK_DEVICE_STATE: the device state goes through a pipe the
//! VMM hands over, on a thread of its own, so the reply to SET_DEVICE_STATE_FD never waits
//! on the pipe (QEMU reads or writes its other end only after that reply). CHECK_DEVICE_STATE
//! waits for the thread and answers its result.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use log::{error, info};
use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};

use super::FuseServer;
use crate::passthrough::migration::{self, StateError};

#[derive(Default)]
pub struct Transfer {
    running: Mutex<Option<JoinHandle<Result<(), StateError>>>>,
    stats: Arc<MigrationStats>,
}

/// Where the device-state transfers stand, for `--metrics`.
#[derive(Default)]
pub struct MigrationStats {
    state: AtomicU8,
    last_bytes: AtomicU64,
    last_duration_us: AtomicU64,
    /// Saves and loads, each ok and failed.
    saved: AtomicU64,
    loaded: AtomicU64,
    failed_saves: AtomicU64,
    failed_loads: AtomicU64,
}

/// The states `MigrationStats::state` reports, in the order of their numbers.
pub const MIGRATION_STATES: [&str; 6] = ["none", "saving", "loading", "saved", "loaded", "failed"];

/// A reading of `MigrationStats`.
pub struct MigrationSnapshot {
    /// One of `MIGRATION_STATES`.
    pub state: &'static str,
    /// The last finished transfer's state size and how long it took.
    pub last_bytes: u64,
    pub last_duration_s: f64,
    pub saved: u64,
    pub loaded: u64,
    pub failed_saves: u64,
    pub failed_loads: u64,
}

impl MigrationStats {
    pub fn snapshot(&self) -> MigrationSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MigrationSnapshot {
            state: MIGRATION_STATES
                .get(self.state.load(Ordering::Relaxed) as usize)
                .copied()
                .unwrap_or("none"),
            last_bytes: l(&self.last_bytes),
            last_duration_s: l(&self.last_duration_us) as f64 / 1e6,
            saved: l(&self.saved),
            loaded: l(&self.loaded),
            failed_saves: l(&self.failed_saves),
            failed_loads: l(&self.failed_loads),
        }
    }

    fn finish(&self, save: bool, started: Instant, r: &Result<usize, StateError>) {
        let (ok, failed, state) = match save {
            true => (&self.saved, &self.failed_saves, 3),
            false => (&self.loaded, &self.failed_loads, 4),
        };
        match r {
            Ok(bytes) => {
                self.last_bytes.store(*bytes as u64, Ordering::Relaxed);
                let us = started.elapsed().as_micros().min(u64::MAX as u128) as u64;
                self.last_duration_us.store(us, Ordering::Relaxed);
                ok.fetch_add(1, Ordering::Relaxed);
                self.state.store(state, Ordering::Relaxed);
            }
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
                self.state.store(5, Ordering::Relaxed);
            }
        }
    }
}

impl Transfer {
    pub fn start(
        &self,
        server: Arc<FuseServer>,
        queues: usize,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<()> {
        if phase != VhostTransferStatePhase::STOPPED {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "device state is transferred only while the device is stopped",
            ));
        }
        let mut running = self.running.lock().unwrap();
        match running.take() {
            // An earlier transfer still going: refused (joining it here could wait on its
            // pipe for ever).
            Some(old) if !old.is_finished() => {
                *running = Some(old);
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    "a device state transfer is still running",
                ));
            }
            // One nobody checked: its result no longer matters.
            Some(old) => drop(old.join()),
            None => {}
        }
        let t = std::thread::Builder::new().name("vfsd-device-state".into());
        let (stats, started) = (self.stats.clone(), Instant::now());
        let is_save = direction == VhostTransferStateDirection::SAVE;
        let state = if is_save { 1 } else { 2 };
        *running = Some(t.spawn(move || {
            // Before the transfer, which can't finish before it (so `finish` comes after).
            stats.state.store(state, Ordering::Relaxed);
            let r = match is_save {
                true => save(&server, file),
                false => load(&server, queues, file),
            };
            stats.finish(is_save, started, &r);
            r.map(|_| ())
        })?);
        Ok(())
    }

    pub fn stats(&self) -> &MigrationStats {
        &self.stats
    }

    pub fn check(&self) -> io::Result<()> {
        let Some(t) = self.running.lock().unwrap().take() else {
            return Err(io::Error::other("no device state transfer to check"));
        };
        match t.join() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(io::Error::other(e.to_string())),
            Err(_) => Err(io::Error::other("the device state thread panicked")),
        }
    }
}

/// Ok: the state's size in bytes.
fn save(server: &FuseServer, mut pipe: File) -> Result<usize, StateError> {
    // The rings are stopped: the suspended requests are all there are.
    let in_flight = server.suspended();
    let r = server.fs().save_state(&in_flight).and_then(|state| {
        pipe.write_all(&state)?;
        info!(
            "migration: device state saved ({} bytes, {} request(s) in flight)",
            state.len(),
            in_flight.len()
        );
        Ok(state.len())
    });
    if let Err(e) = &r {
        error!("migration: saving the device state failed: {e}");
    }
    r
}

/// Ok: the state's size in bytes.
fn load(server: &FuseServer, queues: usize, pipe: File) -> Result<usize, StateError> {
    let r = read_state(pipe).and_then(|state| {
        server.set_suspended(Vec::new());
        let report = server.fs().load_state(&state)?;
        // Only for queues this device has: another could never be resumed.
        let in_flight = report.in_flight.iter().filter(|r| (r.queue as usize) < queues);
        server.set_suspended(in_flight.cloned().collect());
        info!(
            "migration: device state loaded ({} bytes): {} nodes, {} handles, {} lock owners, {} left out, {} locks still held elsewhere and waited for, {} request(s) in flight",
            state.len(),
            report.nodes,
            report.handles,
            report.owners,
            report.failed,
            report.waiting_locks,
            report.in_flight.len()
        );
        Ok(state.len())
    });
    if let Err(e) = &r {
        error!("migration: loading the device state failed: {e}");
    }
    r
}

/// The whole state from the pipe, its length checked against the header before the body
/// is read, so a hostile stream can't make vfsd buffer more than the limit.
fn read_state(mut pipe: File) -> Result<Vec<u8>, StateError> {
    let mut head = Vec::with_capacity(migration::HEADER_LEN);
    (&mut pipe)
        .take(migration::HEADER_LEN as u64)
        .read_to_end(&mut head)?;
    let len = migration::parse_header(&head)?;
    let mut all = head;
    all.try_reserve(len)
        .map_err(|_| StateError::TooLarge(len as u64))?;
    pipe.take(len as u64 + 1).read_to_end(&mut all)?;
    if all.len() > migration::HEADER_LEN + len {
        return Err(StateError::Malformed("data after the state's end".into()));
    }
    Ok(all)
}
