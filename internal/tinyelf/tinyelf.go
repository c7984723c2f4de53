// Package tinyelf makes the smallest static x86-64 Linux executables: one
// loadable segment holding the given machine code, entered at its first
// byte. The audit's probe and the seccomp tests use them to run exact
// system call sequences (a pause loop, an int 0x80) with no libc or Go
// runtime in the way.
package tinyelf

import "encoding/binary"

// Exec returns an ELF executable that runs code.
func Exec(code []byte) []byte {
	const base, hdr = 0x400000, 64 + 56
	b := make([]byte, hdr, hdr+len(code))
	copy(b, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1})
	le := binary.LittleEndian
	le.PutUint16(b[16:], 2)        // ET_EXEC
	le.PutUint16(b[18:], 0x3e)     // EM_X86_64
	le.PutUint32(b[20:], 1)        // EV_CURRENT
	le.PutUint64(b[24:], base+hdr) // entry
	le.PutUint64(b[32:], 64)       // program headers
	le.PutUint16(b[52:], 64)       // header size
	le.PutUint16(b[54:], 56)       // program header size
	le.PutUint16(b[56:], 1)        // one program header
	le.PutUint16(b[58:], 64)       // section header size
	ph := b[64:]
	le.PutUint32(ph[0:], 1)                      // PT_LOAD
	le.PutUint32(ph[4:], 5)                      // R+X
	le.PutUint64(ph[16:], base)                  // vaddr
	le.PutUint64(ph[24:], base)                  // paddr
	le.PutUint64(ph[32:], uint64(hdr+len(code))) // filesz
	le.PutUint64(ph[40:], uint64(hdr+len(code))) // memsz
	le.PutUint64(ph[48:], 0x1000)                // align
	return append(b, code...)
}
