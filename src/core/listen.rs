//! Listening sockets: bound by the master with the `listen` options, handed
//! to workers (one shared socket, or one `SO_REUSEPORT` socket per worker).

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, Type};

use crate::http::conf::{Listen, ListenAddr};

/// Binds and listens; errors worded as nginx (`bind() to ADDR failed (98: ...)`).
/// Takes over a socket inherited from an old binary (see `core::upgrade`):
/// it is bound and listening already; the backlog of the new configuration
/// applies.
pub fn adopt(s: Socket, l: &Listen) -> Result<Socket, String> {
    let fail = |what: &str, e: io::Error| {
        format!(
            "{}() to {} failed {}",
            what,
            l.addr,
            crate::core::errno_text(&e)
        )
    };
    s.listen(l.backlog.unwrap_or(511))
        .map_err(|e| fail("listen", e))?;
    s.set_nonblocking(true).map_err(|e| fail("ioctl", e))?;
    Ok(s)
}

/// The address `l` binds, as the kernel reports a bound socket's.
pub fn sock_addr(l: &Listen) -> Option<SockAddr> {
    match &l.addr {
        ListenAddr::Inet(a) => Some(SockAddr::from(*a)),
        ListenAddr::Unix(p) => SockAddr::unix(p).ok(),
        // Datagram sockets are not handed over on a binary upgrade: the new
        // binary binds its own (with reuseport both coexist).
        ListenAddr::Udp(_) => None,
    }
}

pub fn bind(l: &Listen) -> Result<Socket, String> {
    let fail = |what: &str, e: io::Error| {
        format!(
            "{}() to {} failed {}",
            what,
            l.addr,
            crate::core::errno_text(&e)
        )
    };
    let (sock, addr) = match &l.addr {
        ListenAddr::Inet(a) => {
            let s = Socket::new(Domain::for_address(*a), Type::STREAM, None)
                .map_err(|e| fail("socket", e))?;
            s.set_reuse_address(true)
                .map_err(|e| fail("setsockopt", e))?;
            if a.is_ipv6() {
                let _ = s.set_only_v6(l.ipv6only);
            }
            (s, SockAddr::from(*a))
        }
        ListenAddr::Udp(a) => {
            let s = Socket::new(Domain::for_address(*a), Type::DGRAM, None)
                .map_err(|e| fail("socket", e))?;
            s.set_reuse_address(true)
                .map_err(|e| fail("setsockopt", e))?;
            if a.is_ipv6() {
                let _ = s.set_only_v6(l.ipv6only);
            }
            (s, SockAddr::from(*a))
        }
        ListenAddr::Unix(p) => {
            let s = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(|e| fail("socket", e))?;
            (s, SockAddr::unix(p).map_err(|e| fail("bind", e))?)
        }
    };
    if l.reuseport {
        sock.set_reuse_port(true)
            .map_err(|e| fail("setsockopt", e))?;
    }
    if let Some(n) = l.rcvbuf {
        let _ = sock.set_recv_buffer_size(n);
    }
    if let Some(n) = l.sndbuf {
        let _ = sock.set_send_buffer_size(n);
    }
    if let (Some((on, idle, intvl, cnt)), false) =
        (l.so_keepalive, matches!(l.addr, ListenAddr::Udp(_)))
    {
        let _ = sock.set_keepalive(on);
        if on {
            let mut ka = socket2::TcpKeepalive::new();
            if let Some(i) = idle {
                ka = ka.with_time(Duration::from_secs(i));
            }
            if let Some(i) = intvl {
                ka = ka.with_interval(Duration::from_secs(i));
            }
            if let Some(c) = cnt {
                ka = ka.with_retries(c);
            }
            let _ = sock.set_tcp_keepalive(&ka);
        }
    }
    sock.set_cloexec(true).map_err(|e| fail("fcntl", e))?;
    sock.bind(&addr).map_err(|e| fail("bind", e))?;
    if let ListenAddr::Udp(_) = l.addr {
        // No listen(): datagrams are read as they come.
        sock.set_nonblocking(true).map_err(|e| fail("ioctl", e))?;
        return Ok(sock);
    }
    if l.deferred {
        // TCP_DEFER_ACCEPT: wake the worker only when data arrived.
        let v: libc::c_int = 1;
        // SAFETY: valid fd, pointer to a c_int of the given size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    sock.listen(l.backlog.unwrap_or(511))
        .map_err(|e| fail("listen", e))?;
    sock.set_nonblocking(true).map_err(|e| fail("ioctl", e))?;
    Ok(sock)
}
