package guestproto

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
)

// KeySize is the size of the key a host gives the guest in Hello.
const KeySize = 32

// MACSize is the size of the tag a keyed guest appends to every reply.
const MACSize = sha256.Size

// Replies are authenticated because the stream is not only the guest's:
// under gVisor a command running as the guest's uid can open /proc/1/fd/1
// and write frames into it (Linux refuses, the guest being non-dumpable).
// Without a tag a forged exec result for the verifier's request would be
// believed; with one it is dropped (Client.Rejected counts it), and the
// worst a command can do is garble the stream, which fails the sandbox.
// The key travels in Hello, before any command exists, and lives only in
// the guest's memory, which commands cannot read.

// Seal appends the tag of a reply (type, id, payload) under key.
func Seal(key []byte, t Type, id uint32, payload []byte) []byte {
	return append(payload, tag(key, t, id, payload)...)
}

// Open checks and strips the tag of a sealed message.
func Open(key []byte, m Message) (Message, bool) {
	if len(m.Payload) < MACSize {
		return m, false
	}
	body, got := m.Payload[:len(m.Payload)-MACSize], m.Payload[len(m.Payload)-MACSize:]
	if !hmac.Equal(got, tag(key, m.Type, m.ID, body)) {
		return m, false
	}
	m.Payload = body[:len(body):len(body)]
	return m, true
}

func tag(key []byte, t Type, id uint32, payload []byte) []byte {
	h := hmac.New(sha256.New, key)
	var hdr [len("rollbox-guestproto-reply") + 5]byte
	n := copy(hdr[:], "rollbox-guestproto-reply")
	hdr[n] = byte(t)
	binary.BigEndian.PutUint32(hdr[n+1:], id)
	h.Write(hdr[:])
	h.Write(payload)
	return h.Sum(nil)
}
