//! The session: INIT (negotiated by vfsd, see `wire::init`), DESTROY, SYNCFS and
//! NOTIFY_REPLY.

use log::info;

use super::wire::codec::errno;
use super::wire::init;
use super::{Call, FuseServer, Reply};
use crate::filesystem::FileSystem;

impl<F: FileSystem> FuseServer<F> {
    /// INIT: negotiates the full 64-bit flags with the filesystem's wants. A new session:
    /// no wait of an earlier one goes on.
    pub(super) fn init(&self, c: &Call) -> Reply {
        self.waiters.cancel_all();
        let r = init::parse(c.args).and_then(|offer| {
            let want = self.fs.negotiate();
            let (out, session) = init::reply(&offer, want).ok_or_else(|| errno(libc::EPROTO))?;
            if let Some(s) = session {
                info!(
                    "FUSE INIT: guest 7.{} offered {:#x}; vfsd speaks 7.{}, enabled {:#x}",
                    offer.minor, offer.flags, s.minor, s.flags
                );
                self.fs.start_session(s.flags);
            }
            Ok(out)
        });
        Reply::Payload(r)
    }

    pub(super) fn destroy(&self, _: &Call) -> Reply {
        self.waiters.cancel_all();
        self.fs.destroy();
        Reply::Payload(Ok(Vec::new()))
    }

    pub(super) fn syncfs(&self, c: &Call) -> Reply {
        Reply::Payload(self.fs.syncfs(c.hdr.nodeid).map(|_| Vec::new()))
    }

    /// The answer to a retrieve notification, which vfsd never sends: no reply.
    pub(super) fn notify_reply(&self, _: &Call) -> Reply {
        Reply::Nothing { malformed: false }
    }
}
