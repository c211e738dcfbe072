//! Byte ranges as FUSE carries them (`Range`), and one owner's locked ranges, merged and
//! split as the kernel does for POSIX locks (`RangeSet`). Plain data: no host calls.

use std::collections::BTreeMap;
use std::io;

use crate::sys::errno;

/// `OFFSET_MAX`: a FUSE lock ending here runs to the end of the file.
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// A lock request as FUSE carries it: inclusive byte range and F_RDLCK/F_WRLCK/F_UNLCK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub end: u64,
    pub typ: i32,
}

impl Range {
    pub fn new(start: u64, end: u64, typ: u32) -> io::Result<Range> {
        let typ = typ as i32;
        if start > end || end > OFFSET_MAX {
            return Err(errno(libc::EINVAL));
        }
        if typ != libc::F_RDLCK && typ != libc::F_WRLCK && typ != libc::F_UNLCK {
            return Err(errno(libc::EINVAL));
        }
        Ok(Range { start, end, typ })
    }
}

/// One owner's locked ranges, merged and split as the kernel does for POSIX locks.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> (end, type), disjoint.
    ranges: BTreeMap<u64, (u64, i32)>,
}

#[cfg(test)]
thread_local! {
    /// Range entries copied by `RangeSet::clone` on this thread.
    pub(super) static ENTRY_COPIES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Clone for RangeSet {
    fn clone(&self) -> Self {
        #[cfg(test)]
        ENTRY_COPIES.with(|c| c.set(c.get() + self.ranges.len()));
        RangeSet {
            ranges: self.ranges.clone(),
        }
    }
}

impl RangeSet {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// What applying `r` (a lock or an unlock) changes: only the ranges that overlap or
    /// touch it, so a guest holding many ranges pays per request only for those.
    pub fn plan(&self, r: Range) -> Plan {
        let lo = r.start.saturating_sub(1);
        let hi = r.end.saturating_add(1).min(OFFSET_MAX);
        // Disjoint and sorted: the ends are sorted too, so walk back from `hi`.
        let mut old: Vec<(u64, (u64, i32))> = Vec::new();
        for (&s, &(e, t)) in self.ranges.range(..=hi).rev() {
            if e < lo {
                break;
            }
            old.push((s, (e, t)));
        }
        old.reverse();
        let mut window = BTreeMap::new();
        for &(s, (e, t)) in &old {
            if e < r.start || s > r.end {
                window.insert(s, (e, t));
                continue;
            }
            // Overlapping: keep the parts outside `r`.
            if s < r.start {
                window.insert(s, (r.start - 1, t));
            }
            if e > r.end {
                window.insert(r.end + 1, (e, t));
            }
        }
        if r.typ != libc::F_UNLCK {
            window.insert(r.start, (r.end, r.typ));
        }
        // Merge neighbours of the same type that touch.
        let mut new: Vec<(u64, (u64, i32))> = Vec::new();
        for (s, (e, t)) in window {
            if let Some((_, last)) = new.last_mut() {
                if last.1 == t && last.0 != OFFSET_MAX && last.0 + 1 == s {
                    last.0 = e;
                    continue;
                }
            }
            new.push((s, (e, t)));
        }
        let len_after = self.ranges.len() - old.len() + new.len();
        Plan {
            old: old.into_iter().map(|(s, _)| s).collect(),
            new,
            len_after,
        }
    }

    /// The set of `ranges`, which must be sorted, disjoint and merged, as a set holds
    /// them (checked in one pass; else EINVAL).
    pub(super) fn of_sorted(ranges: &[Range]) -> io::Result<RangeSet> {
        let mut last: Option<&Range> = None;
        for r in ranges {
            Range::new(r.start, r.end, r.typ as u32)?;
            if r.typ == libc::F_UNLCK {
                return Err(errno(libc::EINVAL));
            }
            if let Some(p) = last {
                // p.end < OFFSET_MAX: a later range starts past it.
                if r.start <= p.end || (r.start == p.end + 1 && r.typ == p.typ) {
                    return Err(errno(libc::EINVAL));
                }
            }
            last = Some(r);
        }
        // Sorted input: the map is built in bulk, in linear time.
        Ok(RangeSet {
            ranges: ranges.iter().map(|r| (r.start, (r.end, r.typ))).collect(),
        })
    }

    pub fn commit(&mut self, p: Plan) {
        for s in p.old {
            self.ranges.remove(&s);
        }
        self.ranges.extend(p.new);
    }

    /// The set after `r` is applied (for tests).
    #[cfg(test)]
    pub fn apply(&self, r: Range) -> RangeSet {
        let mut s = self.clone();
        let p = s.plan(r);
        s.commit(p);
        s
    }

    /// Whether a range of this set conflicts with `r` (they overlap and either is a write
    /// lock). Each range looked at costs one of `budget`; none left: false.
    pub(super) fn conflicts(&self, r: &Range, budget: &mut usize) -> bool {
        for (_, &(e, t)) in self.ranges.range(..=r.end).rev() {
            if e < r.start || *budget == 0 {
                return false;
            }
            *budget -= 1;
            if t == libc::F_WRLCK || r.typ == libc::F_WRLCK {
                return true;
            }
        }
        false
    }

    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = Range> + '_ {
        self.ranges
            .iter()
            .map(|(&start, &(end, typ))| Range { start, end, typ })
    }

    /// Whether a range of this set is `r` exactly (the GETLK answer is one of ours).
    pub(super) fn holds(&self, r: &Range) -> bool {
        self.ranges.get(&r.start) == Some(&(r.end, r.typ))
    }
}

/// A change to a `RangeSet`: the starts of the ranges it replaces, and their replacement.
pub struct Plan {
    old: Vec<u64>,
    new: Vec<(u64, (u64, i32))>,
    pub len_after: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64, typ: i32) -> Range {
        Range { start, end, typ }
    }

    #[test]
    fn ranges_split_and_merge_as_posix_locks_do() {
        let s = RangeSet::default().apply(r(0, 99, libc::F_WRLCK));
        assert_eq!(s.len(), 1);
        // Unlocking the middle splits it.
        let s = s.apply(r(40, 59, libc::F_UNLCK));
        assert_eq!(s.len(), 2);
        // A read lock in the hole: three ranges of two types.
        let s = s.apply(r(40, 59, libc::F_RDLCK));
        assert_eq!(s.len(), 3);
        // Writing over the hole merges everything back into one.
        let s = s.apply(r(40, 59, libc::F_WRLCK));
        assert_eq!(s.len(), 1);
        assert!(s.holds(&r(0, 99, libc::F_WRLCK)));
        // Adjacent same-type ranges merge; to-EOF ranges stay whole.
        let s = s.apply(r(100, OFFSET_MAX, libc::F_WRLCK));
        assert!(s.holds(&r(0, OFFSET_MAX, libc::F_WRLCK)));
        let s = s.apply(r(0, OFFSET_MAX, libc::F_UNLCK));
        assert!(s.is_empty());
        // Every other byte: no merging, one range each.
        let mut s = RangeSet::default();
        for i in 0..100 {
            s = s.apply(r(2 * i, 2 * i, libc::F_RDLCK));
        }
        assert_eq!(s.len(), 100);
    }

    #[test]
    fn bad_ranges_are_refused() {
        assert!(Range::new(10, 5, libc::F_RDLCK as u32).is_err());
        assert!(Range::new(0, u64::MAX, libc::F_RDLCK as u32).is_err());
        assert!(Range::new(0, 5, 7).is_err());
        assert!(Range::new(0, OFFSET_MAX, libc::F_UNLCK as u32).is_ok());
    }
}
