//! xattr name mapping: virtiofsd's `--xattrmap` rule language.
//!
//! A map is a list of rules, each `<sep>type<sep>scope<sep>key<sep>prepend<sep>` where
//! `<sep>` is whatever character the rule starts with; whitespace may surround rules.
//! Names the guest passes to get/set/removexattr ("client" names) are tested against
//! `key`; names the host returns from listxattr ("server" names) against `prepend`. The
//! first rule of the right scope whose prefix matches decides:
//!
//! | type          | guest name (get/set/remove)        | host name (listxattr)       |
//! |---------------|------------------------------------|-----------------------------|
//! | `prefix`      | used as `prepend` + name           | shown with `prepend` cut off |
//! | `ok`          | used unchanged                     | shown unchanged             |
//! | `bad`         | EPERM (ENODATA for getxattr)       | hidden                      |
//! | `unsupported` | EOPNOTSUPP                         | hidden                      |
//!
//! `:map:key:prepend:` is shorthand for a complete map and must come last; with an empty
//! key it is `:prefix:all::prepend: :bad:all:::`, otherwise
//! `:prefix:all:key:prepend: :bad:all:prepend:key: :ok:all:::`.
//!
//! A name no rule matches is treated as `bad`, as virtiofsd's C implementation does with
//! the terminator it appends (the Rust one aborts the daemon instead).
//!
//! Without `--xattrmap`, vfsd uses [`DEFAULT_RULES`] (see there and docs/xattrs.md).

use std::borrow::Cow;
use std::ffi::{CStr, CString};
use std::fmt;

/// The map used without `--xattrmap`.
///
/// A guest that sets `security.capability` (setcap) or a `trusted.*` name must not create
/// the real host attribute: a file capability becomes a real privilege on a host that runs
/// files from the share, and `trusted.*` names steer host software such as overlayfs.
/// Both are stored under the private host prefix `user.vfsd.` instead, so the guest still
/// reads back what it set, and the guest may not name `user.vfsd.*` itself (it could
/// otherwise forge a capability other guests then see). The host's own
/// `security.capability` and `trusted.*` names are hidden from the guest's listxattr, since
/// the guest can't reach them by name. Everything else passes unchanged.
///
/// The language matches host names by prefix only, so any host name under `user.vfsd.`
/// is listed with the prefix removed.
pub const DEFAULT_RULES: &str = "
    :prefix:client:security.capability:user.vfsd.:
    :prefix:client:trusted.:user.vfsd.:
    :bad:client:user.vfsd.::
    :prefix:server::user.vfsd.:
    :bad:server::security.capability:
    :bad:server::trusted.:
    :ok:all:::
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Prefix,
    Ok,
    Bad,
    Unsupported,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    kind: Kind,
    client: bool,
    server: bool,
    key: Vec<u8>,
    prepend: Vec<u8>,
}

impl Rule {
    fn all(kind: Kind, key: &[u8], prepend: &[u8]) -> Rule {
        Rule {
            kind,
            client: true,
            server: true,
            key: key.to_vec(),
            prepend: prepend.to_vec(),
        }
    }
}

/// What a guest name becomes on the host.
#[derive(Debug, PartialEq, Eq)]
pub enum HostName<'a> {
    Name(Cow<'a, CStr>),
    /// A `bad` rule (or none) matched.
    Bad,
    /// An `unsupported` rule matched.
    Unsupported,
}

impl<'a> HostName<'a> {
    /// The host name, or the errno the guest gets (`get`: the request is a getxattr).
    pub fn or_errno(self, get: bool) -> std::io::Result<Cow<'a, CStr>> {
        match self {
            HostName::Name(n) => Ok(n),
            HostName::Bad if get => Err(std::io::Error::from_raw_os_error(libc::ENODATA)),
            HostName::Bad => Err(std::io::Error::from_raw_os_error(libc::EPERM)),
            HostName::Unsupported => Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrMap {
    rules: Vec<Rule>,
}

/// A rule string that does not parse; `rule` counts from 1.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseError {
    pub rule: Option<usize>,
    pub msg: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rule {
            Some(n) => write!(f, "rule {n}: {}", self.msg),
            None => f.write_str(&self.msg),
        }
    }
}

impl std::error::Error for ParseError {}

impl XattrMap {
    /// Parses virtiofsd's rule syntax.
    pub fn parse(s: &str) -> Result<XattrMap, ParseError> {
        let mut rules = Vec::new();
        let mut chars = s.chars().peekable();
        let mut n = 0;
        loop {
            while chars.next_if(char::is_ascii_whitespace).is_some() {}
            let Some(sep) = chars.next() else { break };
            n += 1;
            let err = |msg: String| ParseError { rule: Some(n), msg };
            let kind = match &field(&mut chars, sep, "type").map_err(err)?[..] {
                b"prefix" => Kind::Prefix,
                b"ok" => Kind::Ok,
                b"bad" => Kind::Bad,
                b"unsupported" => Kind::Unsupported,
                b"map" => {
                    let key = field(&mut chars, sep, "key").map_err(err)?;
                    let prepend = field(&mut chars, sep, "prepend").map_err(err)?;
                    if chars.any(|c| !c.is_ascii_whitespace()) {
                        return Err(err("a 'map' rule must be the last rule".into()));
                    }
                    rules.push(Rule::all(Kind::Prefix, &key, &prepend));
                    if key.is_empty() {
                        rules.push(Rule::all(Kind::Bad, b"", b""));
                    } else {
                        // The host's own names under `key` are hidden, and the guest may
                        // not reach the prefixed names directly.
                        rules.push(Rule::all(Kind::Bad, &prepend, &key));
                        rules.push(Rule::all(Kind::Ok, b"", b""));
                    }
                    break;
                }
                other => {
                    return Err(err(format!(
                        "unknown type '{}' (expected prefix, ok, bad, unsupported or map)",
                        String::from_utf8_lossy(other)
                    )))
                }
            };
            let (client, server) = match &field(&mut chars, sep, "scope").map_err(err)?[..] {
                b"client" => (true, false),
                b"server" => (false, true),
                b"all" => (true, true),
                other => {
                    return Err(err(format!(
                        "unknown scope '{}' (expected client, server or all)",
                        String::from_utf8_lossy(other)
                    )))
                }
            };
            let key = field(&mut chars, sep, "key").map_err(err)?;
            let prepend = field(&mut chars, sep, "prepend").map_err(err)?;
            rules.push(Rule {
                kind,
                client,
                server,
                key,
                prepend,
            });
        }
        if rules.is_empty() {
            return Err(ParseError {
                rule: None,
                msg: "no rules".into(),
            });
        }
        Ok(XattrMap { rules })
    }

    /// The map used without `--xattrmap` ([`DEFAULT_RULES`]).
    pub fn builtin() -> XattrMap {
        XattrMap::parse(DEFAULT_RULES).expect("the built-in rules parse")
    }

    /// The host name for a name the guest passes to get/set/removexattr.
    pub fn to_host<'a>(&self, guest: &'a CStr) -> HostName<'a> {
        let name = guest.to_bytes();
        let Some(r) = self
            .rules
            .iter()
            .find(|r| r.client && name.starts_with(&r.key))
        else {
            return HostName::Bad;
        };
        match r.kind {
            Kind::Ok => HostName::Name(Cow::Borrowed(guest)),
            Kind::Bad => HostName::Bad,
            Kind::Unsupported => HostName::Unsupported,
            Kind::Prefix if r.prepend.is_empty() => HostName::Name(Cow::Borrowed(guest)),
            Kind::Prefix => {
                let mut v = r.prepend.clone();
                v.extend_from_slice(name);
                // Neither part holds a NUL: the guest's is a C string and `parse` refuses
                // NUL in rules.
                HostName::Name(Cow::Owned(CString::new(v).expect("no NUL")))
            }
        }
    }

    /// The name the guest sees for a host name in a listxattr reply, or None to hide it.
    pub fn to_guest<'a>(&self, host: &'a [u8]) -> Option<&'a [u8]> {
        let r = self
            .rules
            .iter()
            .find(|r| r.server && host.starts_with(&r.prepend))?;
        match r.kind {
            Kind::Ok => Some(host),
            Kind::Prefix => Some(&host[r.prepend.len()..]),
            Kind::Bad | Kind::Unsupported => None,
        }
    }

    /// Maps a listxattr reply (NUL-terminated names) for the guest.
    pub fn list_to_guest(&self, host: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(host.len());
        for name in host.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            // A name stripped to nothing would read as the list's end.
            if let Some(g) = self.to_guest(name).filter(|g| !g.is_empty()) {
                out.extend_from_slice(g);
                out.push(0);
            }
        }
        out
    }
}

/// Reads one field up to `sep`.
fn field(
    chars: &mut std::iter::Peekable<std::str::Chars>,
    sep: char,
    what: &str,
) -> Result<Vec<u8>, String> {
    let mut f = String::new();
    loop {
        match chars.next() {
            Some(c) if c == sep => return Ok(f.into_bytes()),
            Some('\0') => return Err("contains a NUL character".into()),
            Some(c) => f.push(c),
            None => return Err(format!("{what} is not terminated by the separator '{sep}'")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(m: &XattrMap, guest: &str) -> Result<String, i32> {
        let g = CString::new(guest).unwrap();
        match m.to_host(&g) {
            HostName::Name(n) => Ok(n.to_str().unwrap().to_string()),
            HostName::Bad => Err(libc::EPERM),
            HostName::Unsupported => Err(libc::EOPNOTSUPP),
        }
    }

    fn guest(m: &XattrMap, host: &str) -> Option<String> {
        m.to_guest(host.as_bytes())
            .map(|g| String::from_utf8(g.to_vec()).unwrap())
    }

    fn s(x: &str) -> Option<String> {
        Some(x.to_string())
    }

    fn ok(x: &str) -> Result<String, i32> {
        Ok(x.to_string())
    }

    /// The rule table of virtiofsd's xattr-mapping document, rule by rule.
    #[test]
    fn documented_single_rules() {
        let m = XattrMap::parse(":prefix:client:trusted.:user.virtiofs.:").unwrap();
        assert_eq!(host(&m, "trusted.a"), ok("user.virtiofs.trusted.a"));
        assert_eq!(host(&m, "user.a"), Err(libc::EPERM), "no rule matches");
        assert_eq!(
            guest(&m, "user.virtiofs.trusted.a"),
            None,
            "client scope only"
        );

        let m = XattrMap::parse(":prefix:server::user.virtiofs.:").unwrap();
        assert_eq!(guest(&m, "user.virtiofs.trusted.a"), s("trusted.a"));
        assert_eq!(guest(&m, "user.b"), None);
        assert_eq!(host(&m, "trusted.a"), Err(libc::EPERM), "server scope only");

        let m = XattrMap::parse(":prefix:all:trusted.:user.virtiofs.:").unwrap();
        assert_eq!(host(&m, "trusted.a"), ok("user.virtiofs.trusted.a"));
        assert_eq!(guest(&m, "user.virtiofs.trusted.a"), s("trusted.a"));

        let m = XattrMap::parse(":ok:client:user.::").unwrap();
        assert_eq!(host(&m, "user.a"), ok("user.a"));
        assert_eq!(host(&m, "security.a"), Err(libc::EPERM));

        let m = XattrMap::parse(":ok:server::security.:").unwrap();
        assert_eq!(guest(&m, "security.selinux"), s("security.selinux"));
        assert_eq!(guest(&m, "user.a"), None);

        let m = XattrMap::parse(":ok:all:::").unwrap();
        assert_eq!(host(&m, "anything.x"), ok("anything.x"));
        assert_eq!(guest(&m, "anything.x"), s("anything.x"));

        let m = XattrMap::parse(":bad:server::security.:").unwrap();
        assert_eq!(guest(&m, "security.selinux"), None);
    }

    /// Example 1: prefix every name; `:map::user.virtiofs.:` is the same map.
    #[test]
    fn documented_example_1_prefix_all() {
        for rules in [
            ":prefix:all::user.virtiofs.::bad:all:::",
            ":map::user.virtiofs.:",
        ] {
            let m = XattrMap::parse(rules).unwrap();
            assert_eq!(
                host(&m, "trusted.a"),
                ok("user.virtiofs.trusted.a"),
                "{rules}"
            );
            assert_eq!(host(&m, "user.a"), ok("user.virtiofs.user.a"), "{rules}");
            assert_eq!(guest(&m, "user.virtiofs.security.x"), s("security.x"));
            assert_eq!(guest(&m, "security.selinux"), None, "{rules}");
            assert_eq!(guest(&m, "user.other"), None, "{rules}");
        }
        assert_eq!(
            XattrMap::parse(":map::user.virtiofs.:").unwrap(),
            XattrMap::parse(":prefix:all::user.virtiofs.::bad:all:::").unwrap()
        );
    }

    /// Example 2: prefix `trusted.` only; `/map/trusted./user.virtiofs./` is the same.
    #[test]
    fn documented_example_2_prefix_trusted() {
        let long = "/prefix/all/trusted./user.virtiofs./
            /bad/server//trusted./
            /bad/client/user.virtiofs.//
            /ok/all///";
        for rules in [long, "/map/trusted./user.virtiofs./"] {
            let m = XattrMap::parse(rules).unwrap();
            assert_eq!(
                host(&m, "trusted.a"),
                ok("user.virtiofs.trusted.a"),
                "{rules}"
            );
            assert_eq!(host(&m, "user.virtiofs.x"), Err(libc::EPERM), "{rules}");
            assert_eq!(host(&m, "user.a"), ok("user.a"), "{rules}");
            assert_eq!(host(&m, "security.a"), ok("security.a"), "{rules}");
            assert_eq!(guest(&m, "user.virtiofs.trusted.a"), s("trusted.a"));
            assert_eq!(guest(&m, "trusted.host"), None, "{rules}");
            assert_eq!(guest(&m, "user.a"), s("user.a"), "{rules}");
        }
    }

    /// Example 3: hide `security.`, allow the rest.
    #[test]
    fn documented_example_3_hide_security() {
        let m = XattrMap::parse("/bad/all/security./security./\n /ok/all///").unwrap();
        assert_eq!(host(&m, "security.selinux"), Err(libc::EPERM));
        assert_eq!(host(&m, "user.a"), ok("user.a"));
        assert_eq!(guest(&m, "security.selinux"), None);
        assert_eq!(guest(&m, "user.a"), s("user.a"));
    }

    /// virtiofsd's `unsupported` example (security.selinux not supported, rest allowed).
    #[test]
    fn unsupported_refuses_and_hides() {
        let m = XattrMap::parse("/unsupported/all/security.selinux/security.selinux//ok/all///")
            .unwrap();
        assert_eq!(host(&m, "security.selinux"), Err(libc::EOPNOTSUPP));
        assert_eq!(guest(&m, "security.selinux"), None);
        assert_eq!(host(&m, "security.ima"), ok("security.ima"));
        let list = m.list_to_guest(b"security.selinux\0user.a\0security.ima\0");
        assert_eq!(list, b"user.a\0security.ima\0");
    }

    #[test]
    fn errnos_per_operation() {
        let m = XattrMap::parse(":bad:client:b.:::unsupported:client:u.:::ok:all:::").unwrap();
        let n = |s: &'static CStr| m.to_host(s);
        assert_eq!(
            n(c"b.x").or_errno(true).unwrap_err().raw_os_error(),
            Some(libc::ENODATA)
        );
        assert_eq!(
            n(c"b.x").or_errno(false).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        assert_eq!(
            n(c"u.x").or_errno(true).unwrap_err().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
        assert_eq!(n(c"o.x").or_errno(false).unwrap().as_ref(), c"o.x");
    }

    #[test]
    fn any_separator_and_whitespace_between_rules() {
        let m = XattrMap::parse("  zprefixzallza.zp.z\n\t|ok|all|||  ").unwrap();
        assert_eq!(host(&m, "a.1"), ok("p.a.1"));
        assert_eq!(host(&m, "b.1"), ok("b.1"));
        let m = XattrMap::parse(":ok:client:user.::,bad,all,,,").unwrap();
        assert_eq!(host(&m, "user.a"), ok("user.a"));
        assert_eq!(host(&m, "trusted.a"), Err(libc::EPERM));
    }

    #[test]
    fn list_maps_hides_and_strips() {
        let m = XattrMap::parse("/map/trusted./user.virtiofs./").unwrap();
        let host = b"user.a\0trusted.host\0user.virtiofs.trusted.g\0security.selinux\0";
        assert_eq!(
            m.list_to_guest(host),
            b"user.a\0trusted.g\0security.selinux\0"
        );
        assert_eq!(m.list_to_guest(b""), b"");
        // A host name equal to the prefix would strip to an empty name: dropped.
        let m = XattrMap::parse(":prefix:all::user.p.:").unwrap();
        assert_eq!(m.list_to_guest(b"user.p.\0user.p.x\0"), b"x\0");
    }

    #[test]
    fn parse_errors() {
        let e = |s: &str| XattrMap::parse(s).unwrap_err().to_string();
        assert_eq!(e(""), "no rules");
        assert_eq!(e(" \n "), "no rules");
        assert!(e(":prefix:client:hi").contains("rule 1: key is not terminated"));
        assert!(e(":ok:all::").contains("rule 1"), "{}", e(":ok:all::"));
        assert!(e(":ok:all::::").contains("rule 2: type is not terminated"));
        assert!(e(":tomato:all:::").contains("rule 1: unknown type 'tomato'"));
        assert!(e(":ok:all::: /ok/everywhere///").contains("rule 2: unknown scope 'everywhere'"));
        assert!(e(":map:a.:b.: :ok:all:::").contains("rule 1: a 'map' rule must be the last"));
        assert!(e(":map:a.:b.::map:a.:b.:").contains("must be the last"));
        assert!(e(":map:a.:").contains("rule 1: prepend is not terminated"));
        assert!(e(":ok:all:a\0::").contains("NUL"));
        // Trailing whitespace after a map rule is fine.
        XattrMap::parse(":map:a.:b.:  \n").unwrap();
    }

    #[test]
    fn default_map_hides_privileged_names_under_a_private_prefix() {
        let m = XattrMap::builtin();
        assert_eq!(
            host(&m, "security.capability"),
            ok("user.vfsd.security.capability")
        );
        assert_eq!(
            host(&m, "trusted.overlay.opaque"),
            ok("user.vfsd.trusted.overlay.opaque")
        );
        assert_eq!(host(&m, "user.vfsd.security.capability"), Err(libc::EPERM));
        assert_eq!(host(&m, "user.vfsd.x"), Err(libc::EPERM));
        assert_eq!(
            host(&m, "user.vfsd"),
            ok("user.vfsd"),
            "not under the prefix"
        );
        assert_eq!(host(&m, "security.selinux"), ok("security.selinux"));
        assert_eq!(host(&m, "user.a"), ok("user.a"));
        let list = b"user.a\0security.capability\0trusted.host\0security.selinux\0\
                     user.vfsd.security.capability\0user.vfsd.trusted.g\0";
        assert_eq!(
            m.list_to_guest(list),
            b"user.a\0security.selinux\0security.capability\0trusted.g\0"
        );
    }
}
