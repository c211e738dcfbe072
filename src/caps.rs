//! Capabilities when running as root: keep only what serving a share needs
//! (virtiofsd's default set, plus CAP_LINUX_IMMUTABLE so guest root's `chattr +i/+a`
//! works as on a local filesystem; a non-root guest user never gets it, since switching
//! to the caller's fsuid drops it), adjustable with `--modcaps=+cap:-cap`.

use caps::{CapSet, Capability, CapsHashSet};

const DEFAULT: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_MKNOD,
    Capability::CAP_SETFCAP,
    Capability::CAP_LINUX_IMMUTABLE,
];

/// The process's capabilities could not be read or set.
#[derive(Debug, thiserror::Error)]
#[error("capabilities")]
pub struct CapsError(#[from] caps::errors::CapsError);

/// Parses `+name:-name:…` (names with or without the `cap_` prefix, any case).
pub fn parse_modcaps(spec: &str) -> Result<Vec<(bool, Capability)>, String> {
    spec.split(':')
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (add, name) = match item.split_at(1) {
                ("+", n) => (true, n),
                ("-", n) => (false, n),
                _ => return Err(format!("--modcaps: '{item}' must start with + or -")),
            };
            let upper = name.to_ascii_uppercase();
            let full = if upper.starts_with("CAP_") {
                upper
            } else {
                format!("CAP_{upper}")
            };
            let cap: Capability = full
                .parse()
                .map_err(|_| format!("--modcaps: unknown capability '{name}'"))?;
            Ok((add, cap))
        })
        .collect()
}

/// Reduces the process's capabilities to the default set adjusted by `modcaps`.
/// A no-op when not root (an unprivileged daemon has none to drop).
pub fn drop_to(modcaps: &[(bool, Capability)]) -> Result<(), CapsError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    // Files are created as the guest caller (fsuid/fsgid, and the one supplementary group
    // a request may carry): the daemon's own supplementary groups must not count in the
    // host's checks. Not fatal where a user namespace denies setgroups.
    // SAFETY: an empty list; glibc applies it to every thread.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        log::debug!("setgroups: {}", std::io::Error::last_os_error());
    }
    let mut keep: CapsHashSet = DEFAULT.iter().copied().collect();
    for &(add, cap) in modcaps {
        if add {
            keep.insert(cap);
        } else {
            keep.remove(&cap);
        }
    }
    let have = caps::read(None, CapSet::Permitted)?;
    let keep: CapsHashSet = keep.intersection(&have).copied().collect();
    for cap in caps::all() {
        if !keep.contains(&cap) {
            // Not fatal: a bounding-set drop needs CAP_SETPCAP, which may already be gone.
            let _ = caps::drop(None, CapSet::Bounding, cap);
        }
    }
    caps::set(None, CapSet::Effective, &keep)?;
    caps::set(None, CapSet::Permitted, &keep)?;
    caps::clear(None, CapSet::Inheritable)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modcaps_parse() {
        let v = parse_modcaps("+sys_admin:-mknod:+CAP_DAC_READ_SEARCH").unwrap();
        assert_eq!(
            v,
            vec![
                (true, Capability::CAP_SYS_ADMIN),
                (false, Capability::CAP_MKNOD),
                (true, Capability::CAP_DAC_READ_SEARCH)
            ]
        );
        assert!(parse_modcaps("sys_admin").is_err());
        assert!(parse_modcaps("+nonsense").is_err());
    }
}
