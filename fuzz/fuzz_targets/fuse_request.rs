//! Arbitrary bytes become a sequence of FUSE requests served through
//! `vfsd::server::FuseServer::handle`; see `vfsd_fuzz::request` for the input format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        vfsd_fuzz::write_seeds_if_asked(vfsd_fuzz::request::seeds);
        vfsd_fuzz::init();
    },
    |data: &[u8]| vfsd_fuzz::request::run(data)
);
