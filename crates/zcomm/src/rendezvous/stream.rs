//! The two transports of a rendezvous: TCP (`host:port`, ranks on several hosts) and a Unix
//! socket (`unix:PATH`, the ranks of one host that `ztrain --gpus N` starts: no port at all).
//!
//! A Unix socket is only as private as its directory: rank 0 binds only inside a directory
//! that is owned by the running user and that nobody else may enter (mode `0700`, see
//! [`check_private_dir`]); and both ends check the other's credentials (`SO_PEERCRED`): a
//! process of another user, root included, is refused ([`check_peer_uid`]). The handshake's
//! authentication runs on top of either transport unchanged.

use crate::error::{CommError, Result};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a rendezvous address names a Unix socket: `unix:` and its path.
pub const UNIX_PREFIX: &str = "unix:";

/// The socket path of a `unix:PATH` address; None for a TCP one.
#[must_use]
pub fn unix_path(addr: &str) -> Option<&Path> {
    addr.strip_prefix(UNIX_PREFIX).map(Path::new)
}

/// A connection of the rendezvous, over either transport.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(d),
            Stream::Unix(s) => s.set_read_timeout(d),
        }
    }

    pub(crate) fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(d),
            Stream::Unix(s) => s.set_write_timeout(d),
        }
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
        }
    }

    /// No delay on small writes (TCP's Nagle off; a Unix socket has none).
    pub(crate) fn set_nodelay(&self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nodelay(true),
            Stream::Unix(_) => Ok(()),
        }
    }

    pub(crate) fn shutdown(&self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        }
    }

    pub(crate) fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    /// The peer, for messages.
    #[must_use]
    pub fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "an unknown address".into(), |a| a.to_string()),
            Stream::Unix(s) => match peer_uid(s) {
                Ok(uid) => format!("a local process of uid {uid}"),
                Err(_) => "a local process".into(),
            },
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// The effective uid of the process at the other end of `s` (`SO_PEERCRED`: as it was when
/// it connected, or, for a listening peer, when it listened).
pub(crate) fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
        .map(|c| c.uid())
        .map_err(std::io::Error::from)
}

/// This process's effective uid: the only user whose processes may take part.
#[must_use]
pub(crate) fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// A peer of another user is refused with [`CommError::ForeignPeer`], whatever it would say.
pub fn check_peer_uid(socket: &Path, peer_uid: u32, own_uid: u32) -> Result<()> {
    if peer_uid == own_uid {
        Ok(())
    } else {
        Err(CommError::ForeignPeer {
            socket: socket.display().to_string(),
            peer_uid,
            own_uid,
        })
    }
}

/// The directory `socket` is to be made in is owned by `uid` and closed to every other user
/// (no bit for group or others): nobody else can reach, replace or squat the socket.
pub fn check_private_dir(socket: &Path, uid: u32) -> Result<PathBuf> {
    let dir = socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| private_dir_err(socket, "the path has no directory".into(), None))?;
    // Not following a link: a link to someone else's directory is not this user's.
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| private_dir_err(socket, "cannot read its directory".into(), Some(e)))?;
    if !meta.is_dir() {
        return Err(private_dir_err(
            socket,
            "its directory is not a directory (a link?)".into(),
            None,
        ));
    }
    if meta.uid() != uid {
        return Err(private_dir_err(
            socket,
            format!(
                "its directory belongs to uid {}, not to this user (uid {uid})",
                meta.uid()
            ),
            None,
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(private_dir_err(
            socket,
            format!("its directory has mode {mode:o}: others may enter it; it must be 700"),
            None,
        ));
    }
    Ok(dir.to_path_buf())
}

fn private_dir_err(socket: &Path, detail: String, source: Option<std::io::Error>) -> CommError {
    CommError::Rendezvous {
        addr: format!("{UNIX_PREFIX}{}", socket.display()),
        rank: 0,
        detail: format!("the rendezvous socket must be in a private directory: {detail}"),
        source,
    }
}

/// Rank 0's listening Unix socket at `socket`, in a private directory ([`check_private_dir`]).
pub(crate) fn bind_unix(socket: &Path) -> Result<UnixListener> {
    check_private_dir(socket, own_uid())?;
    let l = UnixListener::bind(socket).map_err(|e| CommError::Rendezvous {
        addr: format!("{UNIX_PREFIX}{}", socket.display()),
        rank: 0,
        detail: format!("cannot listen on the socket: {e}"),
        source: Some(e),
    })?;
    l.set_nonblocking(true).map_err(|e| CommError::Rendezvous {
        addr: format!("{UNIX_PREFIX}{}", socket.display()),
        rank: 0,
        detail: format!("cannot listen on the socket: {e}"),
        source: Some(e),
    })?;
    Ok(l)
}

/// A connection to rank 0's Unix socket; rank 0 must be a process of this user.
pub(crate) fn connect_unix(socket: &Path) -> std::result::Result<UnixStream, ConnectFailure> {
    let s = UnixStream::connect(socket).map_err(ConnectFailure::Io)?;
    let uid = peer_uid(&s).map_err(ConnectFailure::Io)?;
    check_peer_uid(socket, uid, own_uid()).map_err(ConnectFailure::Refused)?;
    Ok(s)
}

/// Why a connection to a Unix socket failed: not there yet (retry), or not ours (stop).
pub(crate) enum ConnectFailure {
    Io(std::io::Error),
    Refused(CommError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::same_user(1000, 1000, true)]
    #[case::another_user(1001, 1000, false)]
    #[case::root_for_a_user(0, 1000, false)]
    #[case::a_user_for_root(1000, 0, false)]
    fn only_a_peer_of_the_same_uid_is_accepted(
        #[case] peer: u32,
        #[case] own: u32,
        #[case] accepted: bool,
    ) {
        let got = check_peer_uid(Path::new("/run/x/rdv.sock"), peer, own);
        assert_eq!(got.is_ok(), accepted, "{got:?}");
        if let Err(e) = got {
            assert!(
                matches!(e, CommError::ForeignPeer { peer_uid, own_uid, .. } if peer_uid == peer && own_uid == own)
            );
            assert!(e.to_string().contains(&format!("uid {peer}")), "{e}");
        }
    }

    #[test]
    fn a_socket_is_made_only_in_a_directory_others_cannot_enter() {
        let dir = tempfile::tempdir().unwrap();
        let me = own_uid();
        let socket = dir.path().join("rdv.sock");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = check_private_dir(&socket, me).unwrap_err();
        assert!(e.to_string().contains("mode 755"), "{e}");
        assert!(bind_unix(&socket).is_err());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = check_private_dir(&socket, me.wrapping_add(1)).unwrap_err();
        assert!(e.to_string().contains("not to this user"), "{e}");
        check_private_dir(&socket, me).unwrap();
        let _l = bind_unix(&socket).unwrap();
        // The listener's own credentials are this process's: a rank checks them on connect.
        let c = connect_unix(&socket)
            .ok()
            .expect("rank 0 of the same user is accepted");
        assert_eq!(peer_uid(&c).unwrap(), me);
    }
}
