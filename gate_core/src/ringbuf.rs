//! A reader of one BPF ring buffer map through its memory, for the kernel-denial readers in
//! Python (`gatewrap.bpf.loader.RunHooks`): no descriptor of its own.
//!
//! libbpf's `ring_buffer__new` makes an epoll instance per buffer (ring_buffer__add puts the
//! map's fd in it); a daemon polling thousands of runs' buffers from one epoll of its own
//! held one such instance per idle sandbox (issue 23, target 4). The map's own fd polls
//! readable while records wait (kernel/bpf/ringbuf.c, `ringbuf_map_poll_kern`), so the caller
//! polls that fd and calls [`RingReader::consume`].
//!
//! The layout and the protocol are the kernel's (kernel/bpf/ringbuf.c,
//! include/uapi/linux/bpf.h, Documentation/bpf/ringbuf.rst), read as libbpf's ringbuf.c reads
//! them: the first page holds the consumer position (mapped writable), the second the
//! producer position, then the data pages, mapped twice in a row so a record that wraps
//! around the end reads as one slice. Each record starts with an 8-byte header whose first
//! 32 bits are its length and two flags: BUSY (still being written: stop there) and DISCARD
//! (skip it). Positions only grow; a record's place is `pos & (size - 1)`.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// include/uapi/linux/bpf.h
const BUSY_BIT: u32 = 1 << 31;
const DISCARD_BIT: u32 = 1 << 30;
const HDR_SZ: u64 = 8;

/// One ring buffer's memory, mapped from its map fd (which may be closed after: the
/// mappings hold the map).
#[derive(Debug)]
pub struct RingReader {
    consumer: *mut libc::c_void,
    producer: *mut libc::c_void,
    page: usize,
    mask: u64,
}

// SAFETY: the mappings are process-wide memory, read with atomics; the caller serialises
// `consume` (one consumer per buffer: the consumer position is shared).
unsafe impl Send for RingReader {}
unsafe impl Sync for RingReader {}

impl RingReader {
    /// Map the ring buffer behind `map_fd`, whose data area is `size` bytes (its
    /// `max_entries`: a power of two, a multiple of the page size).
    pub fn new(map_fd: RawFd, size: u64) -> io::Result<RingReader> {
        if size == 0 || !size.is_power_of_two() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("ring buffer size {size} is not a power of two")));
        }
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        // SAFETY: a fresh shared mapping of the map's first page, checked below.
        let consumer = unsafe { libc::mmap(std::ptr::null_mut(), page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, map_fd, 0) };
        if consumer == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let len = page + 2 * size as usize;
        // SAFETY: as above, the producer page and the data pages twice.
        let producer = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, map_fd, page as libc::off_t) };
        if producer == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: the mapping made above.
            unsafe { libc::munmap(consumer, page) };
            return Err(e);
        }
        Ok(RingReader { consumer, producer, page, mask: size - 1 })
    }

    fn consumer_pos(&self) -> &AtomicU64 {
        // SAFETY: the first 8 bytes of the consumer page, aligned, mapped while self lives.
        unsafe { &*(self.consumer as *const AtomicU64) }
    }

    fn producer_pos(&self) -> &AtomicU64 {
        // SAFETY: the first 8 bytes of the producer page, aligned, mapped while self lives.
        unsafe { &*(self.producer as *const AtomicU64) }
    }

    /// Hand every record already written to `each` (its bytes, valid during the call), in
    /// order, without waiting; returns how many. An error from `each` stops there, that
    /// record counted as read (as libbpf's `ring_buffer__consume` does).
    pub fn consume<E>(&self, mut each: impl FnMut(&[u8]) -> Result<(), E>) -> Result<usize, E> {
        let mut n = 0;
        loop {
            let mut got = false;
            let mut cons = self.consumer_pos().load(Ordering::Acquire);
            let prod = self.producer_pos().load(Ordering::Acquire);
            while cons < prod {
                // SAFETY: (cons & mask) < size, and the data pages are mapped twice from
                // `page` on, so the header and a record of at most size bytes lie inside.
                let at = unsafe { (self.producer as *const u8).add(self.page + (cons & self.mask) as usize) };
                // SAFETY: a record header is 8-byte aligned (lengths are rounded up to 8).
                let len = unsafe { &*(at as *const AtomicU32) }.load(Ordering::Acquire);
                if len & BUSY_BIT != 0 {
                    return Ok(n);
                }
                got = true;
                let body = (len & !(BUSY_BIT | DISCARD_BIT)) as u64;
                let next = cons + ((body + HDR_SZ + 7) & !7);
                if len & DISCARD_BIT == 0 {
                    // SAFETY: the record's body follows its header, inside the double mapping.
                    let sample = unsafe { std::slice::from_raw_parts(at.add(HDR_SZ as usize), body as usize) };
                    let handed = each(sample);
                    self.consumer_pos().store(next, Ordering::Release);
                    handed?;
                    n += 1;
                } else {
                    self.consumer_pos().store(next, Ordering::Release);
                }
                cons = next;
            }
            if !got {
                return Ok(n);
            }
        }
    }
}

impl Drop for RingReader {
    fn drop(&mut self) {
        // SAFETY: the two mappings made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.consumer, self.page);
            libc::munmap(self.producer, self.page + 2 * (self.mask as usize + 1));
        }
    }
}
