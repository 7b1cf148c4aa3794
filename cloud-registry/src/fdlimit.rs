//! The process's file-descriptor limit (`RLIMIT_NOFILE`): raised to the
//! hard limit at start, so `http.max_connections` can be served.

/// The soft and hard `RLIMIT_NOFILE` of this process, in descriptors
/// (`RLIM_INFINITY` for "unlimited"; Linux: `u64`). `None` when the limit cannot be read.
pub fn nofile_limits() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    Some((lim.rlim_cur, lim.rlim_max))
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit and return the soft
/// limit in force afterwards, in descriptors. When raising fails (or the
/// limit cannot be read) the limit is left as it was; the error is the
/// OS error of `setrlimit`.
pub fn raise_nofile_to_hard() -> std::io::Result<u64> {
    let (soft, hard) = nofile_limits().ok_or_else(std::io::Error::last_os_error)?;
    if soft >= hard {
        return Ok(soft);
    }
    let lim = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid rlimit; lowering nothing, raising the soft
    // limit up to the hard one is allowed to unprivileged processes.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(hard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_reaches_the_hard_limit() {
        let (_, hard) = nofile_limits().unwrap();
        assert_eq!(raise_nofile_to_hard().unwrap(), hard);
        assert_eq!(nofile_limits().unwrap().0, hard);
    }
}
