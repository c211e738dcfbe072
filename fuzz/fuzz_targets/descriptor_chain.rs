//! Arbitrary descriptor tables, avail rings and indirect tables, popped from a virtqueue as
//! the device does and served through `vfsd::server::FuseServer::handle`; see
//! `vfsd_fuzz::chain` for the input format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        vfsd_fuzz::write_seeds_if_asked(vfsd_fuzz::chain::seeds);
        vfsd_fuzz::init();
    },
    |data: &[u8]| vfsd_fuzz::chain::run(data)
);
