//! Arbitrary bytes loaded as a migration's device state into a fresh filesystem, as a
//! destination daemon loads it; see `vfsd_fuzz::state` for the input format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        vfsd_fuzz::write_seeds_if_asked(vfsd_fuzz::state::seeds);
        vfsd_fuzz::init();
    },
    |data: &[u8]| vfsd_fuzz::state::run(data)
);
