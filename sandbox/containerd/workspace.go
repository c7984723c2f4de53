package containerd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/rollbox/rollbox/sandbox"
)

// A sandbox's files (its workdir and /tmp) live in layers: size-limited
// tmpfs mounted on the host, one writable (the upper) and any number of
// frozen ones below it (lowers, shared with the sandboxes forked from the
// same state). The container does not mount them itself: each of its two
// directories is a bind of a host mount point, the anchor, made with
// rslave propagation, so what the host mounts on the anchor later shows in
// the container. A fresh sandbox has its upper bound on the anchor; a fork
// swaps that for an overlay of the layers, in the running containers.
//
// Fork makes no copy of bytes: the parent's upper is frozen (its tmpfs
// remounted read-only, which the kernel refuses while a file on it is open
// for writing) and becomes the lowest new layer of the parent and of every
// child, each of which gets an empty upper on top, of what the spec's size
// leaves above the layers below it (limitAbove): a sandbox's layers hold
// at most its disk together, however many forks it descends from.

// layer is one tmpfs on the host: upper/ holds the files, work/ is the
// overlay's work directory beside them.
type layer struct {
	path   string
	sizeMB int
	refs   int // guarded by Backend.layersMu
}

func (l *layer) upperDir() string { return filepath.Join(l.path, "upper") }

// wsRoot is one of a sandbox's directories (the workdir or /tmp).
type wsRoot struct {
	dest   string // in the container
	anchor string // the host mount point bound into the container
	sizeMB int
	mode   os.FileMode
	upper  *layer
	lowers []*layer // the top one first
}

// workspace is a sandbox's two directories on the host.
type workspace struct {
	dir   string
	roots []*wsRoot
}

// maxLayers bounds how deep a sandbox's layers may stack through forks of
// forks (overlayfs takes up to 500; the mount options must fit a page):
// beyond it a fork copies the files once into a single layer.
var maxLayers = 24

// instance is a Backend's own directory under StateDir, locked while the
// process lives, so a cleanup tells a dead process's mounts from a live
// one's.
type instance struct {
	dir  string
	lock *os.File
}

func newInstance(stateDir string) (*instance, error) {
	dir := filepath.Join(stateDir, "i-"+randomHex(6))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %v: %w", f.Name(), err, sandbox.ErrSandboxFailed)
	}
	// The lock is held until the process ends: sandboxes outlive
	// Backend.Close.
	return &instance{dir: dir, lock: f}, nil
}

// newLayer mounts a tmpfs of sizeMB for a layer named name.
func (b *Backend) newLayer(name string, sizeMB int) (*layer, error) {
	inst, err := b.instance()
	if err != nil {
		return nil, err
	}
	l := &layer{path: filepath.Join(inst.dir, "l", name), sizeMB: sizeMB, refs: 1}
	if err := os.MkdirAll(l.path, 0o700); err != nil {
		return nil, fmt.Errorf("layer directory: %v: %w", err, sandbox.ErrSandboxFailed)
	}
	if err := unix.Mount("tmpfs", l.path, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.Itoa(sizeMB)+"m,mode=0700"); err != nil {
		os.Remove(l.path)
		return nil, fmt.Errorf("layer tmpfs %s: %v: %w", l.path, err, sandbox.ErrSandboxFailed)
	}
	if err := os.Mkdir(filepath.Join(l.path, "work"), 0o700); err != nil {
		b.dropLayer(l)
		return nil, fmt.Errorf("layer %s: %v: %w", l.path, err, sandbox.ErrSandboxFailed)
	}
	return l, nil
}

// dropLayer takes one reference from l; the last unmounts it.
func (b *Backend) dropLayer(l *layer) error {
	b.layersMu.Lock()
	l.refs--
	last := l.refs <= 0
	b.layersMu.Unlock()
	if !last {
		return nil
	}
	if err := unix.Unmount(l.path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount layer %s: %w", l.path, err)
	}
	os.Remove(l.path)
	return nil
}

func (b *Backend) dropLayers(ls []*layer) error {
	var errs []error
	for _, l := range ls {
		errs = append(errs, b.dropLayer(l))
	}
	return errors.Join(errs...)
}

func (b *Backend) holdLayers(ls []*layer) {
	b.layersMu.Lock()
	for _, l := range ls {
		l.refs++
	}
	b.layersMu.Unlock()
}

// newWorkspace makes a sandbox's anchors and empty uppers, and the mounts
// of its container: binds of the anchors that receive what the host mounts
// on them later (rslave). The uppers go on the anchors once the
// container's mount namespace exists (bindUppers).
func (b *Backend) newWorkspace(id string, spec sandbox.Spec) (*workspace, []specs.Mount, error) {
	inst, err := b.instance()
	if err != nil {
		return nil, nil, err
	}
	ws := &workspace{dir: filepath.Join(inst.dir, id)}
	l := spec.Limits
	var out []specs.Mount
	for i, r := range []struct {
		dest   string
		sizeMB int
		mode   os.FileMode
	}{{spec.Workdir, l.DiskMB, 0o755}, {"/tmp", l.TmpMB, os.ModeSticky | 0o777}} {
		root := &wsRoot{dest: r.dest, anchor: filepath.Join(ws.dir, strconv.Itoa(i)), sizeMB: r.sizeMB, mode: r.mode}
		ws.roots = append(ws.roots, root)
		if err := os.MkdirAll(root.anchor, 0o700); err != nil {
			b.releaseWorkspace(ws)
			return nil, nil, fmt.Errorf("anchor directory: %v: %w", err, sandbox.ErrSandboxFailed)
		}
		// An empty read-only tmpfs, shared: what is mounted on it later
		// propagates to the container's bind of it.
		if err := unix.Mount("anchor", root.anchor, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,nr_inodes=1,mode=0755"); err != nil {
			b.releaseWorkspace(ws)
			return nil, nil, fmt.Errorf("anchor %s: %v: %w", root.anchor, err, sandbox.ErrSandboxFailed)
		}
		if err := unix.Mount("", root.anchor, "", unix.MS_SHARED, ""); err != nil {
			b.releaseWorkspace(ws)
			return nil, nil, fmt.Errorf("share anchor %s: %v: %w", root.anchor, err, sandbox.ErrSandboxFailed)
		}
		up, err := b.newLayer(id+"-"+strconv.Itoa(i)+"-0", r.sizeMB)
		if err != nil {
			b.releaseWorkspace(ws)
			return nil, nil, err
		}
		root.upper = up
		if err := makeUpper(up, uid, gid, r.mode); err != nil {
			b.releaseWorkspace(ws)
			return nil, nil, err
		}
		out = append(out, specs.Mount{
			Destination: r.dest, Type: "bind", Source: root.anchor,
			Options: []string{"bind", "rslave", "ro", "nosuid", "nodev", "noexec"},
		})
	}
	return ws, out, nil
}

// makeUpper makes l's upper directory with an owner and mode.
func makeUpper(l *layer, uid, gid int, mode os.FileMode) error {
	dir := l.upperDir()
	err := os.Mkdir(dir, 0o700)
	if err == nil {
		err = os.Chown(dir, uid, gid)
	}
	if err == nil {
		err = os.Chmod(dir, mode)
	}
	if err != nil {
		return fmt.Errorf("layer %s: %v: %w", l.path, err, sandbox.ErrSandboxFailed)
	}
	return nil
}

// bindUppers puts each root's upper on its anchor: the container sees its
// files from then on.
func (ws *workspace) bindUppers() error {
	for _, r := range ws.roots {
		if err := unix.Mount(r.upper.upperDir(), r.anchor, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %v: %w", r.upper.upperDir(), r.anchor, err, sandbox.ErrSandboxFailed)
		}
		if err := unix.Mount("", r.anchor, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("remount %s: %v: %w", r.anchor, err, sandbox.ErrSandboxFailed)
		}
	}
	return nil
}

// remountOverlay replaces what is mounted on r's anchor by an overlay of
// its layers.
func (r *wsRoot) remountOverlay() error {
	if err := unix.Unmount(r.anchor, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %v: %w", r.anchor, err, sandbox.ErrSandboxFailed)
	}
	lower := make([]string, len(r.lowers))
	for i, l := range r.lowers {
		lower[i] = l.upperDir()
	}
	opts := "lowerdir=" + strings.Join(lower, ":") + ",upperdir=" + r.upper.upperDir() +
		",workdir=" + filepath.Join(r.upper.path, "work") + ",index=off,redirect_dir=off,metacopy=off"
	if err := unix.Mount("overlay", r.anchor, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("overlay on %s: %v: %w", r.anchor, err, sandbox.ErrSandboxFailed)
	}
	return nil
}

// releaseWorkspace unmounts a sandbox's anchors (the container's copies go
// with them) and drops its layers.
func (b *Backend) releaseWorkspace(ws *workspace) error {
	var errs []error
	for _, r := range ws.roots {
		for range 4 { // what is on the anchor, then the anchor
			if err := unix.Unmount(r.anchor, unix.MNT_DETACH); err != nil {
				if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("unmount %s: %w", r.anchor, err))
				}
				break
			}
		}
		if r.upper != nil {
			if err := b.dropLayer(r.upper); err != nil {
				errs = append(errs, err)
			}
			r.upper = nil
		}
		for _, l := range r.lowers {
			if err := b.dropLayer(l); err != nil {
				errs = append(errs, err)
			}
		}
		r.lowers = nil
	}
	if len(errs) == 0 {
		os.RemoveAll(ws.dir)
	}
	return errors.Join(errs...)
}

// freeze makes the layers r's files are now, for the children of a fork
// to mount below their own uppers, each held once for the caller (who
// drops them with dropLayers once the children hold their own). The parent's
// upper is frozen in place (remounted read-only) and a new empty upper
// goes on top for the parent; when the kernel refuses (a file on it is
// open for writing: EBUSY) or the layers are already maxLayers deep, the
// files as the parent sees them are copied once into a new layer instead
// and the parent is left as it was.
func (b *Backend) freeze(id string, seq int, r *wsRoot) ([]*layer, error) {
	name := id + "-" + filepath.Base(r.anchor) + "-" + strconv.Itoa(seq)
	if len(r.lowers)+1 < maxLayers {
		err := unix.Mount("", r.upper.path, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
		if err == nil {
			return b.stackUpper(name, r)
		}
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("freeze %s: %v: %w", r.dest, err, sandbox.ErrSandboxFailed)
		}
	}
	return b.copyLayer(name, r)
}

// stackUpper puts a new empty upper on the parent's now read-only one.
func (b *Backend) stackUpper(name string, r *wsRoot) ([]*layer, error) {
	frozen := r.upper
	thaw := func() {
		unix.Mount("", frozen.path, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, "")
	}
	up, err := b.newLayer(name, r.sizeMB)
	if err != nil {
		thaw()
		return nil, err
	}
	if err := up.limitAbove(r.sizeMB, append([]*layer{frozen}, r.lowers...)); err != nil {
		thaw()
		b.dropLayer(up)
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(frozen.upperDir(), &st); err != nil {
		thaw()
		b.dropLayer(up)
		return nil, fmt.Errorf("stat %s: %v: %w", frozen.upperDir(), err, sandbox.ErrSandboxFailed)
	}
	if err := makeUpper(up, int(st.Uid), int(st.Gid), os.FileMode(st.Mode&0o777)|unixModeBits(st.Mode)); err != nil {
		thaw()
		b.dropLayer(up)
		return nil, err
	}
	r.upper, r.lowers = up, append([]*layer{frozen}, r.lowers...)
	if err := r.remountOverlay(); err != nil {
		// Back to the upper as it was, so the parent keeps its files.
		r.upper, r.lowers = frozen, r.lowers[1:]
		thaw()
		b.dropLayer(up)
		unix.Unmount(r.anchor, unix.MNT_DETACH)
		if len(r.lowers) == 0 {
			unix.Mount(frozen.upperDir(), r.anchor, "", unix.MS_BIND, "")
		} else {
			r.remountOverlay()
		}
		return nil, err
	}
	chain := append([]*layer(nil), r.lowers...)
	b.holdLayers(chain)
	return chain, nil
}

// copyLayer copies the files r shows into a new layer, frozen, that is the
// one layer of the children.
func (b *Backend) copyLayer(name string, r *wsRoot) ([]*layer, error) {
	size := r.sizeMB
	for _, l := range r.lowers {
		size += l.sizeMB
	}
	l, err := b.newLayer(name, size)
	if err != nil {
		return nil, err
	}
	if err := copyTree(r.anchor, l.upperDir()); err != nil {
		b.dropLayer(l)
		if errors.Is(err, sandbox.ErrTooLarge) {
			return nil, fmt.Errorf("copy %s: %w", r.dest, err) // the sandbox's files, not the infrastructure
		}
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			// The layer holds what the sandbox's disk limit allows; its
			// files take more once copied only when its commands made them
			// so (a sparse file, hard links: each copied in full).
			return nil, fmt.Errorf("copy %s: the sandbox's files take more room copied than its disk limit gives (sparse files or hard links, copied in full): %v: %w", r.dest, err, sandbox.ErrTooLarge)
		}
		return nil, fmt.Errorf("copy %s: %v: %w", r.dest, err, sandbox.ErrSandboxFailed)
	}
	if err := unix.Mount("", l.path, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		b.dropLayer(l)
		return nil, fmt.Errorf("freeze the copy of %s: %v: %w", r.dest, err, sandbox.ErrSandboxFailed)
	}
	// The one reference is the caller's: the parent does not hold it.
	return []*layer{l}, nil
}

// adopt mounts chain below a fresh sandbox's empty upper: the sandbox sees
// the files of the sandbox it was forked from. Its upper's root takes the
// owner and mode of the files' root.
func (b *Backend) adopt(r *wsRoot, chain []*layer) error {
	var st unix.Stat_t
	if err := unix.Stat(chain[0].upperDir(), &st); err != nil {
		return fmt.Errorf("stat %s: %v: %w", chain[0].upperDir(), err, sandbox.ErrSandboxFailed)
	}
	dir := r.upper.upperDir()
	if err := os.Chown(dir, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %v: %w", dir, err, sandbox.ErrSandboxFailed)
	}
	if err := os.Chmod(dir, os.FileMode(st.Mode&0o777)|unixModeBits(st.Mode)); err != nil {
		return fmt.Errorf("chmod %s: %v: %w", dir, err, sandbox.ErrSandboxFailed)
	}
	if err := r.upper.limitAbove(r.sizeMB, chain); err != nil {
		return err
	}
	b.holdLayers(chain)
	r.lowers = append([]*layer(nil), chain...)
	return r.remountOverlay()
}

// minUpperKB is the least an upper is given above lowers that fill the
// disk: room for directories and whiteouts, not for data.
const minUpperKB = 64

// limitAbove sizes l, an empty upper, to what the sandbox's disk of sizeMB
// leaves above lowers: the layers a sandbox sees hold at most its disk
// together (a fork's files count against its limit, as on Docker and
// WASM), however long the chain of forks it comes from. The lowers' bytes
// count whole, hidden files included: they stay in memory while a
// sandbox holds them.
func (l *layer) limitAbove(sizeMB int, lowers []*layer) error {
	kb := int64(sizeMB) << 10
	for _, low := range lowers {
		used, err := low.usedKB()
		if err != nil {
			return err
		}
		kb -= used
	}
	kb = max(kb, minUpperKB)
	if err := unix.Mount("", l.path, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.FormatInt(kb, 10)+"k"); err != nil {
		return fmt.Errorf("size the layer %s to %d KB: %v: %w", l.path, kb, err, sandbox.ErrSandboxFailed)
	}
	return nil
}

// usedKB is what l's tmpfs holds.
func (l *layer) usedKB() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(l.path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %v: %w", l.path, err, sandbox.ErrSandboxFailed)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize >> 10, nil
}

// unixModeBits are the setuid, setgid and sticky bits of a unix mode as
// os.FileMode bits.
func unixModeBits(m uint32) os.FileMode {
	var out os.FileMode
	if m&unix.S_ISUID != 0 {
		out |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		out |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		out |= os.ModeSticky
	}
	return out
}
