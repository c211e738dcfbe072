//! SET_DEVICE_STATE_FD and CHECK_DEVICE_STATE: the device state goes through a pipe the
//! VMM hands over, on a thread of its own, so the reply to SET_DEVICE_STATE_FD never waits
//! on the pipe (QEMU reads or writes its other end only after that reply). CHECK_DEVICE_STATE
//! waits for the thread and answers its result.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use log::{error, info};
use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};

use crate::passthrough::migration::{self, StateError};
use crate::server::FuseServer;

#[derive(Default)]
pub struct Transfer {
    running: Mutex<Option<JoinHandle<Result<(), StateError>>>>,
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
        *running = Some(match direction {
            VhostTransferStateDirection::SAVE => t.spawn(move || save(&server, file))?,
            VhostTransferStateDirection::LOAD => t.spawn(move || load(&server, queues, file))?,
        });
        Ok(())
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

fn save(server: &FuseServer, mut pipe: File) -> Result<(), StateError> {
    // The rings are stopped: the suspended requests are all there are.
    let in_flight = server.suspended();
    let r = server.fs().save_state(&in_flight).and_then(|state| {
        pipe.write_all(&state)?;
        info!(
            "migration: device state saved ({} bytes, {} request(s) in flight)",
            state.len(),
            in_flight.len()
        );
        Ok(())
    });
    if let Err(e) = &r {
        error!("migration: saving the device state failed: {e}");
    }
    r
}

fn load(server: &FuseServer, queues: usize, pipe: File) -> Result<(), StateError> {
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
        Ok(())
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
