package vm

import (
	"fmt"
	"io"
)

// cpioFile is one entry of an initramfs: a directory (mode 040xxx) or a
// regular file (0100xxx) with its contents.
type cpioFile struct {
	name string
	mode uint32
	data []byte
}

// writeCpio writes files as a cpio archive in the "newc" format the kernel
// unpacks an initramfs from, ending with the TRAILER!!! entry.
func writeCpio(w io.Writer, files []cpioFile) error {
	pad := func(n int) error {
		if r := n % 4; r != 0 {
			_, err := w.Write(make([]byte, 4-r))
			return err
		}
		return nil
	}
	entry := func(ino int, f cpioFile) error {
		nlink := 1
		if f.mode&0o40000 != 0 {
			nlink = 2
		}
		// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
		// devminor, rdevmajor, rdevminor, namesize, check.
		hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, f.mode, 0, 0, nlink, 0, len(f.data), 0, 0, 0, 0, len(f.name)+1, 0)
		if _, err := io.WriteString(w, hdr+f.name+"\x00"); err != nil {
			return err
		}
		if err := pad(len(hdr) + len(f.name) + 1); err != nil {
			return err
		}
		if _, err := w.Write(f.data); err != nil {
			return err
		}
		return pad(len(f.data))
	}
	for i, f := range files {
		if err := entry(i+1, f); err != nil {
			return err
		}
	}
	return entry(0, cpioFile{name: "TRAILER!!!"})
}
