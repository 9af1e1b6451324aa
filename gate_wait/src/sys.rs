//! Thin wrappers over the libc calls the waiter makes.

use std::io;

/// An owned file descriptor, closed on drop.
#[derive(Debug)]
pub struct Fd(pub libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the fd is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// A libc return value: -1 becomes the errno as an error.
pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Write all of `bytes` to `fd` (retrying partial writes and EINTR).
pub fn write_all(fd: libc::c_int, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length come from a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// Send all of `bytes` on the unix socket `sock` with `fd` attached (SCM_RIGHTS, unix(7);
/// the descriptor goes with the first byte, the rest is written plainly).
pub fn send_with_fd(sock: libc::c_int, bytes: &[u8], fd: libc::c_int) -> io::Result<()> {
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: a zeroed msghdr is valid; its pointers below point at live locals.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control holds CMSG_SPACE(one int) bytes: room for one header and one fd.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd);
    }
    let sent = loop {
        // SAFETY: msg is fully set up above.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    if sent == 0 && !bytes.is_empty() {
        return Err(io::ErrorKind::WriteZero.into());
    }
    write_all(sock, &bytes[sent..])
}

/// Read into `buf` (retrying EINTR): the number of bytes read, 0 at end of file.
pub fn read(fd: libc::c_int, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: the pointer and length come from a live buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// One line on stderr, prefixed `gatewrap: ` (failures to write it are ignored: stderr is
/// the only place to say anything).
pub fn say(message: &str) {
    let _ = write_all(2, format!("gatewrap: {message}\n").as_bytes());
}

/// The waiter's own failure on stderr, prefixed `gatewrap-wait: `.
pub fn fail(message: &str) {
    let _ = write_all(2, format!("gatewrap-wait: {message}\n").as_bytes());
}

/// Whether `fd` is an open file descriptor (fcntl(2) F_GETFD).
pub fn is_open(fd: libc::c_int) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}
