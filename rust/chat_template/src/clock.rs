//! `strftime_now(format)`: HF defines it as `datetime.now().strftime(format)`
//! (local time, naive datetime). Python hands the format to the C library's
//! strftime after expanding the directives it implements itself; we do the same.

use minijinja::{Error, ErrorKind};
use std::ffi::CString;
use std::time::{SystemTime, UNIX_EPOCH};

/// Formats the current local time like Python's `datetime.now().strftime(fmt)`.
pub fn strftime_now(format: &str) -> Result<String, Error> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    format_local_time(now.as_secs() as libc::time_t, now.subsec_micros(), format)
}

fn format_local_time(secs: libc::time_t, micros: u32, format: &str) -> Result<String, Error> {
    // Python expands %f (microseconds) itself; %z and %Z are empty for a naive
    // datetime. Everything else goes to the C library.
    let mut c_format = String::with_capacity(format.len());
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            c_format.push(c);
            continue;
        }
        match chars.next() {
            Some('f') => c_format.push_str(&format!("{micros:06}")),
            Some('z') | Some('Z') => {}
            Some(other) => {
                c_format.push('%');
                c_format.push(other);
            }
            None => c_format.push('%'),
        }
    }
    if c_format.is_empty() {
        return Ok(String::new());
    }
    let c_format = CString::new(c_format).map_err(|_| {
        Error::new(ErrorKind::InvalidOperation, "strftime_now: format contains a NUL character")
    })?;

    // SAFETY: localtime_r fills the zeroed tm we own; strftime writes at most
    // buf.len() bytes into buf and returns how many it wrote (0 if too small).
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return Err(Error::new(ErrorKind::InvalidOperation, "strftime_now: localtime failed"));
        }
        // strftime returns 0 both for "buffer too small" and for an empty
        // result (e.g. "%p" in some locales), so grow a few times, then give up.
        let mut size = 256usize;
        while size <= 1 << 16 {
            let mut buf = vec![0u8; size];
            let n = libc::strftime(buf.as_mut_ptr() as *mut libc::c_char, size, c_format.as_ptr(), &tm);
            if n > 0 {
                buf.truncate(n);
                return Ok(String::from_utf8_lossy(&buf).into_owned());
            }
            size *= 4;
        }
    }
    Ok(String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_directives() {
        // 2024-02-29 12:34:56 UTC; only check fields independent of the time zone.
        let s = format_local_time(1709210096, 42, "%f|%z|%Z|%%|x").unwrap();
        assert_eq!(s, "000042|||%|x");
        let year = format_local_time(1709210096, 0, "%Y").unwrap();
        assert_eq!(year, "2024");
    }
}
