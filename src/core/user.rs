//! Running request handling without root.
//!
//! tern's workers are threads of one process, and Linux keeps credentials
//! per thread at the syscall level (glibc's `setuid()` is what broadcasts a
//! change to every thread). So the master thread stays root, keeping the
//! power to bind new privileged ports and reopen root-owned logs on reload
//! and USR1, while every thread that touches a request (workers and
//! thread-pool threads) switches to the `user` with raw per-thread
//! `setgroups`/`setresgid`/`setresuid` syscalls before its first request.
//! The cost is zero per request. What it does not give is an address-space
//! boundary between the root thread and the others: that is the trade for
//! in-place reloads, and Rust's memory safety is what guards that boundary.

use std::ffi::CString;

use crate::core::conf::MainConf;

#[derive(Debug, Clone)]
pub struct Creds {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub name: String,
}

/// The credentials workers switch to, or None when not started as root.
/// `Err` is a startup error: started as root with a user (or group) that
/// does not exist, serving as root instead would be worse than not serving.
pub fn resolve(m: &MainConf) -> Result<Option<Creds>, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        if m.user.is_some() {
            crate::elog!(Warn, "the \"user\" directive makes sense only if the master process runs with super-user privileges, ignored");
        }
        return Ok(None);
    }
    let (user, group) = m.user.clone().unwrap_or_else(|| ("nobody".into(), None));
    let cuser = CString::new(user.clone()).map_err(|_| format!("getpwnam(\"{}\") failed", user))?;
    // SAFETY: getpwnam returns a pointer to static storage or NULL; read at once.
    let pw = unsafe { libc::getpwnam(cuser.as_ptr()) };
    if pw.is_null() {
        return Err(format!("getpwnam(\"{}\") failed", user));
    }
    // SAFETY: pw is non-null and points to a valid passwd struct.
    let (uid, mut gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    let explicit_group = group.is_some();
    let group = group.unwrap_or_else(|| {
        if user == "nobody" {
            "nogroup".into()
        } else {
            String::new()
        }
    });
    if !group.is_empty() {
        if let Ok(cg) = CString::new(group.clone()) {
            // SAFETY: as getpwnam.
            let gr = unsafe { libc::getgrnam(cg.as_ptr()) };
            if gr.is_null() && explicit_group {
                return Err(format!("getgrnam(\"{}\") failed", group));
            }
            if !gr.is_null() {
                // SAFETY: gr is non-null.
                gid = unsafe { (*gr).gr_gid };
            }
        }
    }
    Ok(Some(Creds {
        uid,
        gid,
        name: user,
    }))
}

/// Switches the calling thread (only) to `c`.
pub fn drop_thread_privileges(c: &Creds) -> std::io::Result<()> {
    // A thread started by an already unprivileged thread (a pool started
    // lazily by a worker) inherits its credentials: nothing to drop.
    // SAFETY: geteuid has no preconditions; it reports this thread's euid.
    if unsafe { libc::geteuid() } == c.uid && c.uid != 0 {
        return Ok(());
    }
    let check = |r: libc::c_long| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let groups = [c.gid];
    // SAFETY: raw syscalls on the calling thread only, valid arguments.
    unsafe {
        check(libc::syscall(
            libc::SYS_setgroups,
            1 as libc::c_long,
            groups.as_ptr(),
        ))?;
        check(libc::syscall(
            libc::SYS_setresgid,
            c.gid as libc::c_long,
            c.gid as libc::c_long,
            c.gid as libc::c_long,
        ))?;
        check(libc::syscall(
            libc::SYS_setresuid,
            c.uid as libc::c_long,
            c.uid as libc::c_long,
            c.uid as libc::c_long,
        ))?;
    }
    Ok(())
}
