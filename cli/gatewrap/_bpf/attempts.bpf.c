/* raw_tracepoint/sys_exit: a run's write-class syscall on a path that the kernel refused
 * with EROFS (a read-only mount: the protected paths, or any read-only folder of the jail)
 * or EBUSY (a rename or unlink onto a mount point: a protected file is one) is recorded,
 * with the path as the syscall got it. It only reports: the read-only mounts enforce.
 * User space keeps the protected paths of the run among them (kernel_denials.py).
 *
 * It runs at every syscall exit on the host, so the cheapest test comes first (the return
 * value), then the run (gw_runs, by cgroup id), then the syscall number. Loaded from a
 * pinned raw tracepoint link (BPF_RAW_TRACEPOINT_OPEN needs no tracefs), x86-64 only: the
 * register offsets and syscall numbers below are that ABI's. */

#define GW_EROFS 30
#define GW_EBUSY 16
#define GW_AT_FDCWD -100

/* struct pt_regs of x86-64 as the syscall entry saved it (arch/x86/include/uapi/asm/ptrace.h:
 * r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ..., 8 bytes
 * each): the byte offsets of the argument registers (syscall(2): di, si, dx, r10, r8) and of
 * orig_ax, the syscall number. */
#define GW_ARG0 112
#define GW_ARG1 104
#define GW_ARG2 96
#define GW_ARG3 56
#define GW_ORIG_AX 120
#define GW_NONE 0

/* x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl) of the calls that change
 * a path they are given; Python names them (loader.SYSCALL_NAMES). */
#define GW_SYS_TRUNCATE 76
#define GW_SYS_RENAME 82
#define GW_SYS_MKDIR 83
#define GW_SYS_RMDIR 84
#define GW_SYS_CREAT 85
#define GW_SYS_LINK 86
#define GW_SYS_UNLINK 87
#define GW_SYS_SYMLINK 88
#define GW_SYS_CHMOD 90
#define GW_SYS_CHOWN 92
#define GW_SYS_LCHOWN 94
#define GW_SYS_UTIME 132
#define GW_SYS_MKNOD 133
#define GW_SYS_SETXATTR 188
#define GW_SYS_LSETXATTR 189
#define GW_SYS_REMOVEXATTR 197
#define GW_SYS_LREMOVEXATTR 198
#define GW_SYS_UTIMES 235
#define GW_SYS_OPENAT 257
#define GW_SYS_MKDIRAT 258
#define GW_SYS_MKNODAT 259
#define GW_SYS_FCHOWNAT 260
#define GW_SYS_FUTIMESAT 261
#define GW_SYS_UNLINKAT 263
#define GW_SYS_RENAMEAT 264
#define GW_SYS_LINKAT 265
#define GW_SYS_SYMLINKAT 266
#define GW_SYS_FCHMODAT 268
#define GW_SYS_UTIMENSAT 280
#define GW_SYS_RENAMEAT2 316
#define GW_SYS_OPENAT2 437
#define GW_SYS_SETXATTRAT 463
#define GW_SYS_REMOVEXATTRAT 466
#define GW_SYS_FCHMODAT2 452
#define GW_SYS_OPEN 2

static __always_inline __u64 gw_reg(const void *regs, int off)
{
	__u64 v = 0;

	bpf_probe_read_kernel(&v, sizeof(v), (const char *)regs + off);
	return v;
}

/* Record one path argument (register ``path``; its directory fd's register ``dirfd``, or
 * GW_NONE for AT_FDCWD) as a refused write of the run. */
static __always_inline void gw_refused(struct gw_event *ev, const void *regs, int path, int dirfd, __u16 role)
{
	const char *user = (const char *)gw_reg(regs, path);
	long n;

	if (!user)
		return;  /* utimensat(fd, NULL, ...): the fd's file, no path */
	__builtin_memset(&ev->dst, 0, sizeof(ev->dst));
	n = bpf_probe_read_user_str(ev->dst.path, sizeof(ev->dst.path), user);
	if (n <= 1)
		return;
	ev->path_len = n - 1;
	ev->dst_port = role;
	ev->sock_type = dirfd == GW_NONE ? (__u32)GW_AT_FDCWD : (__u32)gw_reg(regs, dirfd);
	record(ev);
}

int gw_sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	long ret = (long)ctx->args[1];
	const void *regs;
	struct gw_event ev = {};
	__u64 cgid, nr;
	int p0 = GW_NONE, d0 = GW_NONE, p1 = GW_NONE, d1 = GW_NONE;

	if (ret != -GW_EROFS && ret != -GW_EBUSY)
		return 0;
	cgid = bpf_get_current_cgroup_id();
	if (!gw_runs.lookup(&cgid))
		return 0;
	regs = (const void *)ctx->args[0];
	nr = gw_reg(regs, GW_ORIG_AX);
	switch (nr) {
	case GW_SYS_OPEN: case GW_SYS_CREAT: case GW_SYS_TRUNCATE: case GW_SYS_MKDIR: case GW_SYS_RMDIR:
	case GW_SYS_UNLINK: case GW_SYS_CHMOD: case GW_SYS_CHOWN: case GW_SYS_LCHOWN: case GW_SYS_UTIME:
	case GW_SYS_UTIMES: case GW_SYS_MKNOD: case GW_SYS_SETXATTR: case GW_SYS_LSETXATTR:
	case GW_SYS_REMOVEXATTR: case GW_SYS_LREMOVEXATTR:
		p0 = GW_ARG0;
		break;
	case GW_SYS_OPENAT: case GW_SYS_OPENAT2: case GW_SYS_MKDIRAT: case GW_SYS_MKNODAT:
	case GW_SYS_FCHOWNAT: case GW_SYS_FUTIMESAT: case GW_SYS_UNLINKAT: case GW_SYS_FCHMODAT:
	case GW_SYS_FCHMODAT2: case GW_SYS_UTIMENSAT: case GW_SYS_SETXATTRAT: case GW_SYS_REMOVEXATTRAT:
		p0 = GW_ARG1;
		d0 = GW_ARG0;
		break;
	case GW_SYS_RENAME: case GW_SYS_LINK:
		p0 = GW_ARG0;
		p1 = GW_ARG1;
		break;
	case GW_SYS_RENAMEAT: case GW_SYS_RENAMEAT2: case GW_SYS_LINKAT:
		p0 = GW_ARG1;
		d0 = GW_ARG0;
		p1 = GW_ARG3;
		d1 = GW_ARG2;
		break;
	case GW_SYS_SYMLINK:
		p1 = GW_ARG1;
		break;
	case GW_SYS_SYMLINKAT:
		p1 = GW_ARG2;
		d1 = GW_ARG1;
		break;
	default:
		return 0;
	}
	fill_task(&ev, cgid);
	ev.hook = GW_HOOK_SYS_EXIT;
	ev.verdict = GW_REFUSED_WRITE;
	ev.family = (__u16)-ret;
	ev.protocol = (__u32)nr;
	if (p0 != GW_NONE)
		gw_refused(&ev, regs, p0, d0, 0);
	if (p1 != GW_NONE)
		gw_refused(&ev, regs, p1, d1, 1);
	return 0;
}
