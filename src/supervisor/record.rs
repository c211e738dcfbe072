//! What the frontend has set up, as the messages that set it up: enough to set a fresh
//! serving process up the same way (`replay_device`, `replay_vrings`). Only the newest
//! message of each kind counts, so the record's size is bounded by the device, not by how
//! long the frontend has been talking.

use std::io;

use super::wire::{self, code, Msg};

/// Queues the record follows; a frontend that names more gets them from the serving
/// process, which refuses them (vfsd has at most a few hundred).
const MAX_VRINGS: usize = 1024;
/// Memory regions the record follows (vhost-user's slots; QEMU uses at most 509).
const MAX_REGIONS: usize = 512;
/// VHOST_F_LOG_ALL: the frontend logs dirty pages, that is, it migrates.
const LOG_ALL: u64 = 1 << 26;

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Vring {
    num: Option<Msg>,
    addr: Option<Msg>,
    /// The base the frontend set, or the one a stop reported (`stopped_at`).
    base: Option<u32>,
    kick: Option<Msg>,
    call: Option<Msg>,
    err: Option<Msg>,
    enable: Option<Msg>,
    /// A kick fd came and no GET_VRING_BASE stopped the ring since: the serving process
    /// pops from it.
    started: bool,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
pub struct Record {
    get_features: bool,
    features: Option<Msg>,
    get_protocol_features: bool,
    protocol_features: Option<Msg>,
    owner: bool,
    backend_req: Option<Msg>,
    mem_table: Option<Msg>,
    regions: Vec<Msg>,
    /// The memory map went somewhere the record can't follow (a region removed that the
    /// record does not have, too many regions): no replay.
    memory_lost: bool,
    vrings: Vec<Vring>,
    /// A device-state transfer began and was not yet checked.
    transfer: bool,
}

impl Record {
    /// Notes a request the frontend sent, before it goes on to the serving process.
    pub fn note(&mut self, m: &Msg) -> io::Result<()> {
        match m.code {
            code::GET_FEATURES => self.get_features = true,
            code::SET_FEATURES => self.features = Some(m.try_clone()?),
            code::GET_PROTOCOL_FEATURES => self.get_protocol_features = true,
            code::SET_PROTOCOL_FEATURES => self.protocol_features = Some(m.try_clone()?),
            code::SET_OWNER => self.owner = true,
            code::RESET_OWNER | code::RESET_DEVICE => self.vrings.clear(),
            code::SET_BACKEND_REQ_FD => self.backend_req = Some(m.try_clone()?),
            code::SET_MEM_TABLE => {
                self.mem_table = Some(m.try_clone()?);
                self.regions.clear();
                self.memory_lost = false;
            }
            code::ADD_MEM_REG if self.regions.len() < MAX_REGIONS => {
                self.regions.push(m.try_clone()?)
            }
            code::ADD_MEM_REG => self.memory_lost = true,
            code::REM_MEM_REG => {
                // Found by guest address and size (body: padding, then the region).
                let key = |r: &Msg| (r.u64_at(1), r.u64_at(2));
                let before = self.regions.len();
                self.regions.retain(|r| key(r) != key(m));
                if self.regions.len() == before {
                    self.memory_lost = true;
                }
            }
            code::SET_DEVICE_STATE_FD => self.transfer = true,
            code::CHECK_DEVICE_STATE => self.transfer = false,
            code::SET_VRING_NUM
            | code::SET_VRING_ADDR
            | code::SET_VRING_BASE
            | code::GET_VRING_BASE
            | code::SET_VRING_KICK
            | code::SET_VRING_CALL
            | code::SET_VRING_ERR
            | code::SET_VRING_ENABLE => {
                let Some(i) = wire::vring_index(m).filter(|&i| i < MAX_VRINGS) else {
                    return Ok(());
                };
                if self.vrings.len() <= i {
                    self.vrings.resize_with(i + 1, Vring::default);
                }
                let v = &mut self.vrings[i];
                match m.code {
                    code::SET_VRING_NUM => v.num = Some(m.try_clone()?),
                    code::SET_VRING_ADDR => v.addr = Some(m.try_clone()?),
                    code::SET_VRING_BASE => v.base = m.u32_at(1),
                    code::GET_VRING_BASE => v.started = false,
                    code::SET_VRING_KICK => {
                        v.started = !m.fds.is_empty();
                        v.kick = Some(m.try_clone()?);
                    }
                    code::SET_VRING_CALL => v.call = Some(m.try_clone()?),
                    code::SET_VRING_ERR => v.err = Some(m.try_clone()?),
                    _ => v.enable = Some(m.try_clone()?),
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Why a handover can't happen now, if it can't: the frontend migrates the device
    /// (dirty logging, or a device-state transfer under way), or the memory map is one the
    /// record lost track of.
    pub fn busy(&self) -> Option<&'static str> {
        let features = self.features.as_ref().and_then(|f| f.u64_at(0));
        if features.is_some_and(|f| f & LOG_ALL != 0) || self.transfer {
            return Some("the frontend is migrating the device");
        }
        if self.memory_lost {
            return Some("the guest memory map changed in a way the supervisor did not follow");
        }
        None
    }

    /// The rings the serving process pops from.
    pub fn started(&self) -> Vec<u32> {
        (self.vrings.iter().enumerate())
            .filter(|(_, v)| v.started)
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Where a stopped ring's next request is (GET_VRING_BASE's answer).
    pub fn stopped_at(&mut self, vring: u32, base: u32) {
        if let Some(v) = self.vrings.get_mut(vring as usize) {
            v.base = Some(base);
            v.started = false;
        }
    }

    /// Marks `rings` started again (their set-up is replayed with their kicks).
    pub fn restart(&mut self, rings: &[u32]) {
        for &i in rings {
            if let Some(v) = self.vrings.get_mut(i as usize) {
                v.started = v.kick.as_ref().is_some_and(|k| !k.fds.is_empty());
            }
        }
    }

    /// Every fd the record holds.
    pub fn fds(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let vrings = self
            .vrings
            .iter()
            .flat_map(|v| [&v.num, &v.addr, &v.kick, &v.call, &v.err, &v.enable]);
        let device = [
            &self.features,
            &self.protocol_features,
            &self.backend_req,
            &self.mem_table,
        ];
        (device.into_iter().chain(vrings))
            .flatten()
            .chain(self.regions.iter())
            .flat_map(|m| m.fds.iter().map(|f| f.as_raw_fd()))
            .collect()
    }

    /// The kick fds of the started rings, to kick after a handover: a kick the old
    /// process read after its ring stopped is not seen by the new one.
    pub fn kicks(&self) -> Vec<&std::os::fd::OwnedFd> {
        (self.vrings.iter())
            .filter(|v| v.started)
            .filter_map(|v| v.kick.as_ref()?.fds.first())
            .collect()
    }

    /// The device's set-up without its rings, in the order QEMU sends it: features,
    /// owner, the backend's request channel, guest memory. No acks are asked for: the
    /// replayer ends with a request that is always answered.
    pub fn replay_device(&self) -> io::Result<Vec<Msg>> {
        let bare = |c| Some(Msg::request(c, Vec::new(), Vec::new()));
        let items = [
            self.get_features
                .then(|| bare(code::GET_FEATURES))
                .flatten(),
            copy(&self.features)?,
            (self.get_protocol_features)
                .then(|| bare(code::GET_PROTOCOL_FEATURES))
                .flatten(),
            copy(&self.protocol_features)?,
            self.owner.then(|| bare(code::SET_OWNER)).flatten(),
            copy(&self.backend_req)?,
            copy(&self.mem_table)?,
        ];
        let mut out: Vec<Msg> = items.into_iter().flatten().collect();
        for m in &self.regions {
            out.push(plain(m)?);
        }
        Ok(out)
    }

    /// The rings' set-up, each ring's base at where it stopped or was set.
    pub fn replay_vrings(&self) -> io::Result<Vec<Msg>> {
        let mut out = Vec::new();
        for (i, v) in self.vrings.iter().enumerate() {
            let base = v.base.map(|b| {
                Msg::request(
                    code::SET_VRING_BASE,
                    wire::vring_state(i as u32, b),
                    Vec::new(),
                )
            });
            let kick = if v.started { copy(&v.kick)? } else { None };
            let items = [
                copy(&v.num)?,
                copy(&v.addr)?,
                base,
                copy(&v.call)?,
                copy(&v.err)?,
                kick,
                copy(&v.enable)?,
            ];
            out.extend(items.into_iter().flatten());
        }
        Ok(out)
    }
}

/// A recorded request as the supervisor sends it again: with its own fds and no ack
/// asked for.
fn plain(m: &Msg) -> io::Result<Msg> {
    let mut c = m.try_clone()?;
    c.flags = Msg::request(0, Vec::new(), Vec::new()).flags;
    Ok(c)
}

fn copy(m: &Option<Msg>) -> io::Result<Option<Msg>> {
    m.as_ref().map(plain).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vring_msg(c: u32, index: u32, num: u32) -> Msg {
        Msg::request(c, wire::vring_state(index, num), Vec::new())
    }

    fn fd() -> std::os::fd::OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    fn kick(index: u64) -> Msg {
        Msg::request(
            code::SET_VRING_KICK,
            index.to_le_bytes().to_vec(),
            vec![fd()],
        )
    }

    #[test]
    fn a_stopped_ring_is_replayed_from_where_it_stopped_without_its_kick() {
        let mut r = Record::default();
        r.note(&vring_msg(code::SET_VRING_NUM, 1, 256)).unwrap();
        r.note(&vring_msg(code::SET_VRING_BASE, 1, 0)).unwrap();
        r.note(&kick(1)).unwrap();
        assert_eq!(r.started(), vec![1]);
        r.stopped_at(1, 77);
        let out = r.replay_vrings().unwrap();
        let codes: Vec<u32> = out.iter().map(|m| m.code).collect();
        // Ring 0 was never set up: nothing for it.
        assert_eq!(codes, vec![code::SET_VRING_NUM, code::SET_VRING_BASE]);
        assert_eq!(out[1].u32_at(1), Some(77));
    }

    #[test]
    fn a_started_ring_is_replayed_with_its_kick_and_the_newest_of_each_message() {
        let mut r = Record::default();
        r.note(&vring_msg(code::SET_VRING_NUM, 0, 128)).unwrap();
        r.note(&vring_msg(code::SET_VRING_NUM, 0, 1024)).unwrap();
        r.note(&kick(0)).unwrap();
        r.note(&vring_msg(code::SET_VRING_ENABLE, 0, 1)).unwrap();
        let out = r.replay_vrings().unwrap();
        let codes: Vec<u32> = out.iter().map(|m| m.code).collect();
        assert_eq!(
            codes,
            vec![
                code::SET_VRING_NUM,
                code::SET_VRING_KICK,
                code::SET_VRING_ENABLE
            ]
        );
        assert_eq!(out[0].u32_at(1), Some(1024));
        assert_eq!(out[1].fds.len(), 1);
        assert_eq!(r.kicks().len(), 1);
    }

    #[test]
    fn memory_regions_follow_adds_and_removes_and_an_unknown_remove_blocks_a_handover() {
        let region = |c, gpa: u64, size: u64| {
            let mut b = vec![0u8; 8];
            for v in [gpa, size, 0x7f00_0000_0000, 0] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            Msg::request(c, b, vec![fd()])
        };
        let mut r = Record::default();
        r.note(&region(code::ADD_MEM_REG, 0, 1 << 30)).unwrap();
        r.note(&region(code::ADD_MEM_REG, 1 << 32, 1 << 30))
            .unwrap();
        r.note(&region(code::REM_MEM_REG, 0, 1 << 30)).unwrap();
        assert!(r.busy().is_none());
        let out = r.replay_device().unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].u64_at(1), Some(1 << 32));
        r.note(&region(code::REM_MEM_REG, 5 << 32, 1 << 30))
            .unwrap();
        assert!(r.busy().is_some());
    }

    #[test]
    fn a_migrating_frontend_blocks_a_handover() {
        let mut r = Record::default();
        let f = |v: u64| Msg::request(code::SET_FEATURES, v.to_le_bytes().to_vec(), Vec::new());
        r.note(&f(1 << 32)).unwrap();
        assert!(r.busy().is_none());
        r.note(&f((1 << 32) | LOG_ALL)).unwrap();
        assert!(r.busy().is_some());
        r.note(&f(1 << 32)).unwrap();
        r.note(&Msg::request(
            code::SET_DEVICE_STATE_FD,
            vec![0; 8],
            vec![fd()],
        ))
        .unwrap();
        assert!(r.busy().is_some());
        r.note(&Msg::request(
            code::CHECK_DEVICE_STATE,
            Vec::new(),
            Vec::new(),
        ))
        .unwrap();
        assert!(r.busy().is_none());
    }
}
