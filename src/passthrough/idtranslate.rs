//! `--translate-uid` / `--translate-gid`: ids translated by the daemon itself between the
//! guest's and the host's numbering, with virtiofsd's rule syntax and meaning.
//!
//! Unlike `--uid-map` (a user namespace around the daemon), nothing here involves the
//! kernel: ids coming from the guest (the caller of a create, a chown) are turned into host
//! ids, and ids going to the guest (every attribute reply) into guest ids. The two
//! directions are independent tables; an id no rule of its direction covers passes
//! unchanged.
//!
//! Rules (`<type>:<a>:<b>[:<c>]`; any one non-alphanumeric character other than `-` and
//! `_` may stand for `:`, as long as it is the same throughout; the type is
//! case-insensitive):
//!
//! | rule                                   | direction     | effect                      |
//! |----------------------------------------|---------------|-----------------------------|
//! | `guest:<guest>:<host>:<count>`         | guest → host  | 1:1 range                   |
//! | `host:<host>:<guest>:<count>`          | host → guest  | 1:1 range                   |
//! | `map:<guest>:<host>:<count>`           | both          | 1:1 range, each way         |
//! | `squash-guest:<guest>:<host>:<count>`  | guest → host  | whole range onto one id     |
//! | `squash-host:<host>:<guest>:<count>`   | host → guest  | whole range onto one id     |
//! | `forbid-guest:<guest>:<count>`         | guest → host  | refused (EIO to the guest)  |
//!
//! Ranges of one direction may not overlap, and `base + count` must stay below 2^32.

use std::fmt;
use std::io;
use std::num::ParseIntError;
use std::str::FromStr;

/// One command-line rule, as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Guest { guest: u32, host: u32, count: u32 },
    Host { host: u32, guest: u32, count: u32 },
    Map { guest: u32, host: u32, count: u32 },
    SquashGuest { guest: u32, host: u32, count: u32 },
    SquashHost { host: u32, guest: u32, count: u32 },
    ForbidGuest { guest: u32, count: u32 },
}

/// Why a rule does not parse; each names the rule as given.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("'{0}': expected <type>:<id>:<id>[:<count>] (types: map, guest, host, squash-guest, squash-host, forbid-guest)")]
    Syntax(String),
    #[error("'{rule}': '{value}' is not an id or count ({source})")]
    Number {
        rule: String,
        value: String,
        #[source]
        source: ParseIntError,
    },
    #[error("'{rule}': unknown type '{kind}' (expected map, guest, host, squash-guest, squash-host or forbid-guest)")]
    Kind { rule: String, kind: String },
    #[error("'{rule}': {kind} takes {want} numbers, got {got}")]
    Count {
        rule: String,
        kind: String,
        want: usize,
        got: usize,
    },
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Rule, RuleError> {
        let mut kind = String::new();
        let mut rest = None;
        for (i, c) in s.char_indices() {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                kind.extend(c.to_lowercase());
            } else {
                rest = Some((c, &s[i + c.len_utf8()..]));
                break;
            }
        }
        let Some((sep, rest)) = rest else {
            return Err(RuleError::Syntax(s.to_string()));
        };
        let nums = rest
            .split(sep)
            .map(|v| {
                v.parse::<u32>().map_err(|source| RuleError::Number {
                    rule: s.to_string(),
                    value: v.to_string(),
                    source,
                })
            })
            .collect::<Result<Vec<u32>, RuleError>>()?;
        let want = if kind == "forbid-guest" { 2 } else { 3 };
        let known = [
            "guest",
            "host",
            "map",
            "squash-guest",
            "squash-host",
            "forbid-guest",
        ];
        if !known.contains(&kind.as_str()) {
            return Err(RuleError::Kind {
                rule: s.to_string(),
                kind,
            });
        }
        if nums.len() != want {
            return Err(RuleError::Count {
                rule: s.to_string(),
                kind,
                want,
                got: nums.len(),
            });
        }
        let (a, b) = (nums[0], nums[1]);
        let c = nums.get(2).copied().unwrap_or(0);
        Ok(match kind.as_str() {
            "guest" => Rule::Guest {
                guest: a,
                host: b,
                count: c,
            },
            "host" => Rule::Host {
                host: a,
                guest: b,
                count: c,
            },
            "map" => Rule::Map {
                guest: a,
                host: b,
                count: c,
            },
            "squash-guest" => Rule::SquashGuest {
                guest: a,
                host: b,
                count: c,
            },
            "squash-host" => Rule::SquashHost {
                host: a,
                guest: b,
                count: c,
            },
            _ => Rule::ForbidGuest { guest: a, count: b },
        })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Rule::Guest { guest, host, count } => write!(f, "guest:{guest}:{host}:{count}"),
            Rule::Host { host, guest, count } => write!(f, "host:{host}:{guest}:{count}"),
            Rule::Map { guest, host, count } => write!(f, "map:{guest}:{host}:{count}"),
            Rule::SquashGuest { guest, host, count } => {
                write!(f, "squash-guest:{guest}:{host}:{count}")
            }
            Rule::SquashHost { host, guest, count } => {
                write!(f, "squash-host:{host}:{guest}:{count}")
            }
            Rule::ForbidGuest { guest, count } => write!(f, "forbid-guest:{guest}:{count}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// `start` goes to this id, `start + 1` to the next, and so on.
    Shift(u32),
    /// Every id of the range goes to this one.
    Squash(u32),
    /// Refused.
    Forbid,
}

/// A source range `[start, end)` and where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
    target: Target,
}

/// One direction's rules, sorted by start and disjoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Table(Vec<Span>);

impl Table {
    fn add(&mut self, start: u32, count: u32, target: Target) -> Result<(), String> {
        let end = start
            .checked_add(count)
            .ok_or_else(|| format!("range {start} + {count} goes past 4294967295"))?;
        if count == 0 {
            // Covers nothing, as in virtiofsd.
            return Ok(());
        }
        if let Target::Shift(base) = target {
            // The target range must fit too: wrapping past 4294967295 would land on 0.
            base.checked_add(count)
                .ok_or_else(|| format!("target range {base} + {count} goes past 4294967295"))?;
        }
        let at = self.0.partition_point(|s| s.start < start);
        let clash = |s: &Span| s.start < end && start < s.end;
        if self.0.get(at).is_some_and(clash) || at > 0 && clash(&self.0[at - 1]) {
            return Err(format!(
                "range [{start}, {end}) overlaps an earlier rule of the same direction"
            ));
        }
        self.0.insert(at, Span { start, end, target });
        Ok(())
    }

    /// `None` for an id the table refuses.
    fn get(&self, id: u32) -> Option<u32> {
        let at = self.0.partition_point(|s| s.start <= id);
        let Some(s) = at.checked_sub(1).map(|i| self.0[i]) else {
            return Some(id);
        };
        if id >= s.end {
            return Some(id);
        }
        match s.target {
            // `add` checked that the whole target range fits.
            Target::Shift(base) => Some(base + (id - s.start)),
            Target::Squash(to) => Some(to),
            Target::Forbid => None,
        }
    }
}

/// The translation of one kind of id (uids or gids), both directions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdTranslation {
    to_host: Table,
    to_guest: Table,
}

impl IdTranslation {
    /// Builds the tables from rules in command-line order; an overlap within one
    /// direction, or a range past 2^32 - 1, is an error naming the rule.
    pub fn new(rules: &[Rule]) -> Result<IdTranslation, String> {
        let mut t = IdTranslation::default();
        for r in rules {
            let res = match *r {
                Rule::Guest { guest, host, count } => {
                    t.to_host.add(guest, count, Target::Shift(host))
                }
                Rule::Host { host, guest, count } => {
                    t.to_guest.add(host, count, Target::Shift(guest))
                }
                Rule::Map { guest, host, count } => t
                    .to_host
                    .add(guest, count, Target::Shift(host))
                    .and_then(|()| t.to_guest.add(host, count, Target::Shift(guest))),
                Rule::SquashGuest { guest, host, count } => {
                    t.to_host.add(guest, count, Target::Squash(host))
                }
                Rule::SquashHost { host, guest, count } => {
                    t.to_guest.add(host, count, Target::Squash(guest))
                }
                Rule::ForbidGuest { guest, count } => t.to_host.add(guest, count, Target::Forbid),
            };
            res.map_err(|e| format!("{r}: {e}"))?;
        }
        Ok(t)
    }

    pub fn is_identity(&self) -> bool {
        self.to_host.0.is_empty() && self.to_guest.0.is_empty()
    }

    /// A guest id as the host knows it. A forbidden id gives EIO: virtiofsd's mapping
    /// error carries no errno, and its reply path turns such errors into EIO.
    pub fn to_host(&self, guest: u32) -> io::Result<u32> {
        self.to_host
            .get(guest)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))
    }

    /// A host id as the guest sees it (this direction never refuses).
    pub fn to_guest(&self, host: u32) -> u32 {
        // No rule puts a refusal in the host-to-guest table.
        self.to_guest.get(host).unwrap_or(host)
    }
}

/// Which way an id (or a value holding ids) travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From a guest request to the host (setxattr values, chown ids, caller ids).
    ToHost,
    /// From the host into a reply to the guest (getxattr values, attributes).
    ToGuest,
}

/// `--translate-uid` and `--translate-gid` together, as the filesystem uses them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdTranslate {
    pub uid: IdTranslation,
    pub gid: IdTranslation,
}

/// `posix_acl_xattr_header.a_version`.
const ACL_XATTR_VERSION: u32 = 2;
/// The entry tags whose `e_id` is a uid or a gid (ACL_USER, ACL_GROUP).
const ACL_USER: u16 = 0x02;
const ACL_GROUP: u16 = 0x08;

impl IdTranslate {
    pub fn is_identity(&self) -> bool {
        self.uid.is_identity() && self.gid.is_identity()
    }

    /// The guest's view of host attributes.
    pub fn stat_to_guest(&self, mut st: libc::stat64) -> libc::stat64 {
        st.st_uid = self.uid.to_guest(st.st_uid);
        st.st_gid = self.gid.to_guest(st.st_gid);
        st
    }

    /// Translates the ids in a `system.posix_acl_access` / `system.posix_acl_default`
    /// value (the kernel's xattr form: a little-endian u32 version, then 8-byte entries
    /// {u16 tag, u16 perm, u32 id}); only ACL_USER and ACL_GROUP entries carry ids. A
    /// malformed value gives EINVAL, as the kernel would answer for it; a forbidden guest
    /// id EIO, as for any other id.
    pub fn translate_acl_xattr(&self, value: &[u8], dir: Direction) -> io::Result<Vec<u8>> {
        let einval = || io::Error::from_raw_os_error(libc::EINVAL);
        if value.len() < 4 || !(value.len() - 4).is_multiple_of(8) {
            return Err(einval());
        }
        if u32::from_le_bytes(value[..4].try_into().unwrap()) != ACL_XATTR_VERSION {
            return Err(einval());
        }
        let mut out = value.to_vec();
        for e in out[4..].chunks_exact_mut(8) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let ids = match tag {
                ACL_USER => &self.uid,
                ACL_GROUP => &self.gid,
                _ => continue,
            };
            let id = u32::from_le_bytes(e[4..8].try_into().unwrap());
            let id = match dir {
                Direction::ToHost => ids.to_host(id)?,
                Direction::ToGuest => ids.to_guest(id),
            };
            e[4..8].copy_from_slice(&id.to_le_bytes());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(specs: &[&str]) -> Vec<Rule> {
        specs.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn table(specs: &[&str]) -> IdTranslation {
        IdTranslation::new(&rules(specs)).unwrap()
    }

    #[test]
    fn parses_every_form_and_prints_it_back() {
        for s in [
            "guest:1000:2000:10",
            "host:2000:1000:10",
            "map:1000:2000:10",
            "squash-guest:0:1000:4294967295",
            "squash-host:0:0:65536",
            "forbid-guest:0:1000",
        ] {
            assert_eq!(s.parse::<Rule>().unwrap().to_string(), s);
        }
        // Field order: the first number is the source of the rule's direction.
        assert_eq!(
            "squash-guest:0:107:4294967295".parse::<Rule>().unwrap(),
            Rule::SquashGuest {
                guest: 0,
                host: 107,
                count: u32::MAX
            }
        );
        assert_eq!(
            "squash-host:1000:0:1".parse::<Rule>().unwrap(),
            Rule::SquashHost {
                host: 1000,
                guest: 0,
                count: 1
            }
        );
    }

    #[test]
    fn separator_may_be_any_punctuation_and_type_any_case() {
        assert_eq!(
            "MAP/1/2/3".parse::<Rule>().unwrap(),
            "map:1:2:3".parse().unwrap()
        );
        assert_eq!(
            "Forbid-Guest,5,6".parse::<Rule>().unwrap(),
            Rule::ForbidGuest { guest: 5, count: 6 }
        );
        // But one separator throughout.
        assert!("map:1/2:3".parse::<Rule>().is_err());
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        let err = |s: &str| s.parse::<Rule>().unwrap_err().to_string();
        assert!(err("").contains("expected"));
        assert!(err("map").contains("expected"));
        assert!(err("mapx:1:2:3").contains("unknown type"));
        assert!(err(":1:2:3").contains("unknown type"));
        assert!(err("map:1:2").contains("takes 3 numbers, got 2"));
        assert!(err("forbid-guest:1:2:3").contains("takes 2 numbers, got 3"));
        assert!(err("map:1:2:3:").contains("not an id"));
        assert!(err("map:-1:2:3").contains("not an id"));
        assert!(err("map:1:2:4294967296").contains("not an id"));
    }

    #[test]
    fn unmatched_ids_pass_unchanged_both_ways() {
        let t = table(&[]);
        assert!(t.is_identity());
        assert_eq!(t.to_host(1234).unwrap(), 1234);
        assert_eq!(t.to_guest(u32::MAX), u32::MAX);
        let t = table(&["map:1000:2000:10"]);
        assert_eq!(t.to_host(999).unwrap(), 999);
        assert_eq!(t.to_host(1010).unwrap(), 1010);
        assert_eq!(t.to_guest(1999), 1999);
        assert_eq!(t.to_guest(2010), 2010);
    }

    #[test]
    fn map_is_one_to_one_both_ways() {
        let t = table(&["map:1000:2000:10"]);
        assert_eq!(t.to_host(1000).unwrap(), 2000);
        assert_eq!(t.to_host(1009).unwrap(), 2009);
        assert_eq!(t.to_guest(2000), 1000);
        assert_eq!(t.to_guest(2005), 1005);
        // The guest range is not a host-side rule: host 1000 is unmapped.
        assert_eq!(t.to_guest(1000), 1000);
    }

    #[test]
    fn guest_and_host_rules_act_one_way_only() {
        let t = table(&["guest:1000:2000:10"]);
        assert_eq!(t.to_host(1003).unwrap(), 2003);
        assert_eq!(t.to_guest(2003), 2003);
        let t = table(&["host:2000:1000:10"]);
        assert_eq!(t.to_guest(2003), 1003);
        assert_eq!(t.to_host(1003).unwrap(), 1003);
    }

    #[test]
    fn squash_rules_fold_a_range_onto_one_id() {
        // virtiofsd's documented unprivileged setup: every guest id becomes the daemon's.
        let t = table(&["squash-guest:0:1000:4294967295", "squash-host:1000:0:1"]);
        assert_eq!(t.to_host(0).unwrap(), 1000);
        assert_eq!(t.to_host(4242).unwrap(), 1000);
        // base + count stays below 2^32: u32::MAX ("no change" in chown) is outside.
        assert_eq!(t.to_host(u32::MAX).unwrap(), u32::MAX);
        assert_eq!(t.to_guest(1000), 0);
        assert_eq!(t.to_guest(1001), 1001);
        let t = table(&["squash-host:0:0:65536"]);
        assert_eq!(t.to_guest(65535), 0);
        assert_eq!(t.to_guest(65536), 65536);
        assert_eq!(t.to_host(5).unwrap(), 5);
    }

    #[test]
    fn forbid_guest_refuses_with_eio_and_leaves_the_host_side_alone() {
        let t = table(&[
            "forbid-guest:0:1000",
            "map:1000:1000:1",
            "forbid-guest:1001:999",
        ]);
        for id in [0, 999, 1001, 1999] {
            assert_eq!(t.to_host(id).unwrap_err().raw_os_error(), Some(libc::EIO));
        }
        assert_eq!(t.to_host(1000).unwrap(), 1000);
        assert_eq!(t.to_host(2000).unwrap(), 2000);
        assert_eq!(t.to_guest(5), 5);
    }

    #[test]
    fn overlaps_within_one_direction_are_errors_naming_the_rule() {
        // The second number of forbid-guest is a count (virtiofsd issue 198).
        let e = IdTranslation::new(&rules(&[
            "forbid-guest:0:999",
            "map:1000:1000:1",
            "forbid-guest:1001:1999",
            "map:2000:2000:1",
        ]))
        .unwrap_err();
        assert!(e.starts_with("map:2000:2000:1: "), "{e}");
        assert!(e.contains("overlaps"), "{e}");
        assert!(IdTranslation::new(&rules(&["map:0:0:10", "squash-guest:9:5:1"])).is_err());
        assert!(IdTranslation::new(&rules(&["map:0:100:10", "host:105:0:1"])).is_err());
        // Different directions may cover the same ids.
        table(&["guest:0:100:10", "host:0:100:10"]);
        // Adjacent ranges do not overlap; empty ones cover nothing.
        table(&["map:0:0:10", "map:10:20:10", "guest:5:5:0"]);
    }

    #[test]
    fn ranges_past_the_last_id_are_errors() {
        let e = IdTranslation::new(&rules(&["map:1:0:4294967295"])).unwrap_err();
        assert!(e.contains("past 4294967295"), "{e}");
        assert!(IdTranslation::new(&rules(&["forbid-guest:4294967295:1"])).is_err());
        table(&["squash-guest:1:0:4294967294"]);
    }

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = ACL_XATTR_VERSION.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    #[test]
    fn acl_values_translate_user_and_group_entries_only() {
        let t = IdTranslate {
            uid: table(&["map:1000:2000:10"]),
            gid: table(&["map:100:200:10", "forbid-guest:50:1"]),
        };
        let none = u32::MAX;
        let guest = acl(&[
            (0x01, 6, none),
            (ACL_USER, 6, 1005),
            (ACL_USER, 4, 7),
            (0x04, 4, none),
            (ACL_GROUP, 5, 105),
            (0x10, 7, none),
            (0x20, 0, none),
        ]);
        let host = acl(&[
            (0x01, 6, none),
            (ACL_USER, 6, 2005),
            (ACL_USER, 4, 7),
            (0x04, 4, none),
            (ACL_GROUP, 5, 205),
            (0x10, 7, none),
            (0x20, 0, none),
        ]);
        assert_eq!(
            t.translate_acl_xattr(&guest, Direction::ToHost).unwrap(),
            host
        );
        assert_eq!(
            t.translate_acl_xattr(&host, Direction::ToGuest).unwrap(),
            guest
        );
        let forbidden = acl(&[(ACL_GROUP, 5, 50)]);
        let e = t.translate_acl_xattr(&forbidden, Direction::ToHost);
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EIO));
        // A uid-only rule does not touch a group entry with the same number.
        assert_eq!(
            t.translate_acl_xattr(&acl(&[(ACL_GROUP, 5, 1005)]), Direction::ToHost)
                .unwrap(),
            acl(&[(ACL_GROUP, 5, 1005)])
        );
        // The header alone is a valid (empty) ACL.
        assert_eq!(
            t.translate_acl_xattr(&acl(&[]), Direction::ToGuest)
                .unwrap(),
            acl(&[])
        );
    }

    #[test]
    fn malformed_acl_values_are_einval() {
        let t = IdTranslate::default();
        let einval = |v: &[u8]| {
            t.translate_acl_xattr(v, Direction::ToHost)
                .unwrap_err()
                .raw_os_error()
        };
        assert_eq!(einval(&[]), Some(libc::EINVAL));
        assert_eq!(einval(&[2, 0, 0]), Some(libc::EINVAL));
        let mut v = acl(&[(ACL_USER, 6, 1)]);
        v.push(0);
        assert_eq!(einval(&v), Some(libc::EINVAL));
        let mut v = acl(&[(ACL_USER, 6, 1)]);
        v[0] = 1;
        assert_eq!(einval(&v), Some(libc::EINVAL));
    }

    #[test]
    fn stat_translation_touches_only_owner_and_group() {
        let t = IdTranslate {
            uid: table(&["map:1000:2000:10"]),
            gid: table(&["squash-host:0:100:1000"]),
        };
        // SAFETY: stat64 is plain old data; all-zero is valid.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        st.st_uid = 2001;
        st.st_gid = 5;
        st.st_mode = 0o100644;
        let g = t.stat_to_guest(st);
        assert_eq!((g.st_uid, g.st_gid, g.st_mode), (1001, 100, 0o100644));
    }
}
