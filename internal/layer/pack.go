package layer

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// The walk goes through directory fds: every entry is reached by an *at
// call on its final name with O_NOFOLLOW, so a symlink the sandbox planted
// in its upper is archived as a symlink, never followed to the host. Files
// are opened with O_NOATIME so packing does not change the tree.

// packer writes one tree as tar entries.
type packer struct {
	ctx   context.Context
	tw    *tar.Writer
	ids   idMap
	links map[fileID]string // first archived name of each multiply-linked inode
	buf   []byte
	st    Stats
	// direct, in Copy, takes the content of large files beside the stream.
	direct *fdQueue
}

type fileID struct{ dev, ino uint64 }

// packTar writes dir as an uncompressed tar stream to w. With direct (Copy
// only), the content of files of directMin bytes or more goes there
// instead of into the stream.
func packTar(ctx context.Context, w io.Writer, dir string, ids idMap, direct *fdQueue) (Stats, error) {
	fd, err := openNoATime(unix.AT_FDCWD, dir, unix.O_DIRECTORY)
	if err != nil {
		return Stats{}, fmt.Errorf("layer: pack %s: %w", dir, classifyOpen(err))
	}
	defer unix.Close(fd)
	cw := &countWriter{w: w}
	p := &packer{ctx: ctx, tw: tar.NewWriter(cw), ids: ids, links: map[fileID]string{}, buf: make([]byte, 256<<10),
		direct: direct}
	if err := p.dir(fd, ".", 0); err != nil {
		return Stats{}, fmt.Errorf("layer: pack %s: %w", dir, err)
	}
	if err := p.tw.Close(); err != nil {
		return Stats{}, fmt.Errorf("layer: pack %s: %w", dir, err)
	}
	p.st.Bytes = cw.n
	return p.st, nil
}

// dir archives the directory fd (at rel, depth levels below the root),
// then its children in name order.
func (p *packer) dir(fd int, rel string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	hdr, err := p.header(rel, &st, tar.TypeDir)
	if err != nil {
		return err
	}
	hdr.Name = rel + "/"
	if err := p.write(hdr, fd); err != nil {
		return err
	}
	p.st.Dirs++
	names, err := readDirNames(fd)
	if err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	for _, name := range names {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		if err := p.child(fd, rel, name, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// child archives the entry name of the directory pfd.
func (p *packer) child(pfd int, prel, name string, depth int) error {
	rel := path.Join(prel, name)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	kind := st.Mode & unix.S_IFMT
	switch kind {
	case unix.S_IFDIR:
		return p.subdir(pfd, name, rel, &st, depth)
	case unix.S_IFSOCK:
		return nil // a live socket means nothing once the sandbox is gone
	case unix.S_IFBLK:
		return fmt.Errorf("%q is a block device: %w", rel, errdefs.ErrInvalidArgument)
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return fmt.Errorf("%q is a device (%d:%d), not a whiteout: %w",
				rel, unix.Major(st.Rdev), unix.Minor(st.Rdev), errdefs.ErrInvalidArgument)
		}
	}
	// Whiteouts are archived one by one, never as hard links: overlayfs
	// links them all to one inode in its workdir (which is not archived),
	// and a whiteout has nothing but its name to share.
	if kind != unix.S_IFCHR {
		if done, err := p.hardlink(rel, &st); done || err != nil {
			return err
		}
	}
	switch kind {
	case unix.S_IFREG:
		return p.file(pfd, name, rel, &st)
	case unix.S_IFLNK:
		return p.symlink(pfd, name, rel, &st)
	case unix.S_IFIFO:
		return p.special(rel, &st, tar.TypeFifo)
	case unix.S_IFCHR:
		p.st.Whiteouts++
		return p.special(rel, &st, tar.TypeChar)
	}
	return fmt.Errorf("%q has unknown file type %#o: %w", rel, kind, errdefs.ErrInvalidArgument)
}

// subdir opens and archives a child directory.
func (p *packer) subdir(pfd int, name, rel string, st *unix.Stat_t, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%q is nested deeper than %d levels: %w", rel, maxDepth, errdefs.ErrInvalidArgument)
	}
	fd, err := openNoATime(pfd, name, unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	defer unix.Close(fd)
	if err := sameFile(fd, rel, st); err != nil {
		return err
	}
	return p.dir(fd, rel, depth)
}

// hardlink writes a link entry if st is an inode archived under another
// name already; the first name is recorded otherwise.
func (p *packer) hardlink(rel string, st *unix.Stat_t) (bool, error) {
	if st.Nlink < 2 {
		return false, nil
	}
	id := fileID{dev: st.Dev, ino: st.Ino}
	first, ok := p.links[id]
	if !ok {
		p.links[id] = rel
		return false, nil
	}
	hdr, err := p.header(rel, st, tar.TypeLink)
	if err != nil {
		return true, err
	}
	hdr.Linkname = first
	p.st.Links++
	return true, p.write(hdr, -1)
}

// file archives a regular file, read through an fd checked to be the
// inode that was listed.
func (p *packer) file(pfd int, name, rel string, st *unix.Stat_t) error {
	fd, err := openNoATime(pfd, name, unix.O_NONBLOCK)
	if err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	defer unix.Close(fd)
	if err := sameFile(fd, rel, st); err != nil {
		return err
	}
	hdr, err := p.header(rel, st, tar.TypeReg)
	if err != nil {
		return err
	}
	hdr.Size = st.Size
	direct := p.direct != nil && st.Size >= directMin
	if direct {
		if err := p.queueContent(fd); err != nil {
			return fmt.Errorf("%q: %w", rel, err)
		}
		hdr.PAXRecords = map[string]string{directKey: strconv.FormatInt(st.Size, 10)}
		hdr.Size = 0
	}
	if err := p.write(hdr, fd); err != nil {
		return err
	}
	if _, isWhiteout := hdr.PAXRecords[paxXattr+whiteoutXattr]; isWhiteout {
		p.st.Whiteouts++
	} else {
		p.st.Files++
	}
	if direct {
		return nil
	}
	src := &ctxReader{ctx: p.ctx, r: io.LimitReader(fdReader(fd), st.Size)}
	n, err := io.CopyBuffer(p.tw, src, p.buf)
	if err == nil && n < st.Size {
		err = fmt.Errorf("shrank to %d bytes while packing: %w", n, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	return nil
}

func (p *packer) symlink(pfd int, name, rel string, st *unix.Stat_t) error {
	target, err := readlinkat(pfd, name)
	if err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	hdr, err := p.header(rel, st, tar.TypeSymlink)
	if err != nil {
		return err
	}
	hdr.Linkname = target
	p.st.Files++
	return p.write(hdr, -1)
}

// special archives a fifo or a whiteout. Neither can carry user.* xattrs
// (the kernel allows them on regular files and directories only).
func (p *packer) special(rel string, st *unix.Stat_t, flag byte) error {
	hdr, err := p.header(rel, st, flag)
	if err != nil {
		return err
	}
	if flag == tar.TypeFifo {
		p.st.Files++
	}
	return p.write(hdr, -1)
}

// header fills the fields every entry has, with ids relative to the range.
func (p *packer) header(rel string, st *unix.Stat_t, flag byte) (*tar.Header, error) {
	uid, uok := p.ids.toRel(st.Uid)
	gid, gok := p.ids.toRel(st.Gid)
	if !uok || !gok {
		return nil, fmt.Errorf("%q is owned by %d:%d, outside the range [%d, %d): %w",
			rel, st.Uid, st.Gid, p.ids.base, uint64(p.ids.base)+uint64(p.ids.size), errdefs.ErrInvalidArgument)
	}
	return &tar.Header{
		Typeflag: flag,
		Name:     rel,
		Mode:     int64(st.Mode & 0o7777),
		Uid:      uid,
		Gid:      gid,
		ModTime:  time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:   tar.FormatPAX, // nanosecond mtimes and xattrs need PAX
	}, nil
}

// write adds the user.* xattrs of fd (when fd ≥ 0) and writes hdr.
func (p *packer) write(hdr *tar.Header, fd int) error {
	if fd >= 0 {
		xattrs, err := listXattrs(fd)
		if err != nil {
			return fmt.Errorf("%q: xattrs: %w", hdr.Name, err)
		}
		total := 0
		for name, value := range xattrs {
			if total += len(name) + len(value); total > maxXattrBytes {
				return fmt.Errorf("%q has more than %d bytes of xattrs: %w", hdr.Name, maxXattrBytes, errdefs.ErrInvalidArgument)
			}
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords[paxXattr+name] = value
		}
	}
	if err := p.tw.WriteHeader(hdr); err != nil {
		if errors.Is(err, tar.ErrHeader) {
			// e.g. an xattr name containing '=', which PAX cannot store
			err = fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("%q: %w", hdr.Name, err)
	}
	return nil
}

// sameFile checks that fd is the inode st described: a mismatch means the
// tree changed under the walk, which only a running sandbox does.
func sameFile(fd int, rel string, st *unix.Stat_t) error {
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil {
		return fmt.Errorf("%q: %w", rel, err)
	}
	if now.Dev != st.Dev || now.Ino != st.Ino {
		return fmt.Errorf("%q changed while packing: %w", rel, errdefs.ErrFailedPrecondition)
	}
	*st = now
	return nil
}
