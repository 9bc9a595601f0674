//! The file-I/O layer (stub until the pool-backed layer lands): every
//! operation that can block on a disk goes through here.
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use crate::config::registry::Spec;
use crate::config::ConfResult;

#[derive(Debug, Clone, Default)]
pub struct IoMain {}
#[derive(Debug, Clone, Default)]
pub struct IoLoc {}
impl IoLoc {
    pub fn merge(&mut self, _p: &IoLoc) {}
    pub fn defaults(&mut self) {}
}
pub const DIRECTIVES: &[Spec] = &[];
pub fn validate_main(_m: &IoMain) -> ConfResult<()> {
    Ok(())
}

#[derive(Debug, Clone, Default)]
pub struct Policy {}

#[derive(Debug)]
pub struct OpenFile {
    pub file: File,
    pub size: u64,
    pub mtime: i64,
    pub ino: u64,
    pub is_dir: bool,
}

pub async fn open(path: &Path, _p: &Policy) -> io::Result<Arc<OpenFile>> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let m = file.metadata()?;
    Ok(Arc::new(OpenFile { size: m.len(), mtime: m.mtime(), ino: m.ino(), is_dir: m.is_dir(), file }))
}

pub async fn read(f: &Arc<OpenFile>, off: u64, len: usize, _p: &Policy) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut v = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = f.file.read_at(&mut v[done..], off + done as u64)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank"));
        }
        done += n;
    }
    Ok(v)
}

pub trait SendSock: AsRawFd {
    fn writable(&self) -> impl std::future::Future<Output = io::Result<()>>;
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}
impl SendSock for tokio::net::TcpStream {
    async fn writable(&self) -> io::Result<()> {
        tokio::net::TcpStream::writable(self).await
    }
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        tokio::net::TcpStream::try_io(self, tokio::io::Interest::WRITABLE, f)
    }
}
impl SendSock for tokio::net::UnixStream {
    async fn writable(&self) -> io::Result<()> {
        tokio::net::UnixStream::writable(self).await
    }
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        tokio::net::UnixStream::try_io(self, tokio::io::Interest::WRITABLE, f)
    }
}

pub async fn send_file<S: SendSock>(s: &S, f: &Arc<OpenFile>, off: u64, len: u64, _p: &Policy) -> io::Result<u64> {
    let mut sent = 0u64;
    while sent < len {
        s.writable().await?;
        let r = s.try_io(|| {
            let mut o: libc::off_t = (off + sent) as libc::off_t;
            let chunk = (len - sent).min(2 << 20) as usize;
            // SAFETY: both fds are valid for the duration of the call; o is a valid pointer.
            let n = unsafe { libc::sendfile(s.as_raw_fd(), f.file.as_raw_fd(), &mut o, chunk) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as u64)
            }
        });
        match r {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank")),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}
