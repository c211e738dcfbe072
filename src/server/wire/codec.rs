//! Decoding a request's bytes: ABI structs, names, and the errnos a malformed one gets.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;

use vm_memory::ByteValued;

/// A `T` from the start of `b`, if it is long enough.
pub fn decode<T: ByteValued + Default>(b: &[u8]) -> Option<T> {
    let mut v = T::default();
    let n = size_of::<T>();
    v.as_mut_slice().copy_from_slice(b.get(..n)?);
    Some(v)
}

pub fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// What a malformed request is answered with.
pub fn inval() -> io::Error {
    errno(libc::EINVAL)
}

/// The arguments `T` at the start of `body`; EINVAL if it is too short.
pub fn args<T: ByteValued + Default>(body: &[u8]) -> io::Result<T> {
    decode::<T>(body).ok_or_else(inval)
}

/// The arguments `T` at the start of `body`, and what follows them.
pub fn split<T: ByteValued + Default>(body: &[u8]) -> io::Result<(T, &[u8])> {
    let a = args::<T>(body)?;
    Ok((a, &body[size_of::<T>()..]))
}

/// A NUL-terminated name at the start of `b` (anything after the first NUL is ignored).
pub fn name(b: &[u8]) -> io::Result<&CStr> {
    CStr::from_bytes_until_nul(b).map_err(|_| inval())
}

/// A NUL-terminated name at the start of `b`, and what follows it.
pub fn name_and_rest(b: &[u8]) -> io::Result<(&CStr, &[u8])> {
    let n = name(b)?;
    Ok((n, &b[n.to_bytes_with_nul().len()..]))
}

/// Two NUL-terminated names, one after the other (RENAME).
pub fn two_names(b: &[u8]) -> io::Result<(&CStr, &CStr)> {
    let (first, rest) = name_and_rest(b)?;
    if rest.is_empty() {
        return Err(inval());
    }
    Ok((first, name(rest)?))
}

/// The arguments `T` and the name after them.
pub fn args_and_name<T: ByteValued + Default>(b: &[u8]) -> io::Result<(T, &CStr)> {
    let (a, rest) = split::<T>(b)?;
    Ok((a, name(rest)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_backend_rs::abi::fuse_abi::MkdirIn;

    #[test]
    fn names_must_be_nul_terminated() {
        assert_eq!(name_and_rest(b"a\0b\0").unwrap().0.to_bytes(), b"a");
        assert_eq!(name_and_rest(b"a\0b\0").unwrap().1, b"b\0");
        assert!(name_and_rest(b"no terminator").is_err());
        assert!(
            args_and_name::<MkdirIn>(&[0u8; 4]).is_err(),
            "short arguments"
        );
    }
}
