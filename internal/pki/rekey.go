package pki

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
)

// ErrNotUnderEitherKey is returned (wrapped, naming the item) when a sealed
// item opens under neither the old nor the new key-encryption key during a
// rotation: it was sealed under a third key, or it is damaged. The rotation
// stops there and changes nothing more.
var ErrNotUnderEitherKey = errors.New("sealed data opens under neither the old nor the new key-encryption key")

// RekeyCount counts the sealed items one part of a KEK rotation visited.
type RekeyCount struct {
	// Resealed opened under the old KEK and were sealed again under the new.
	Resealed int `json:"resealed"`
	// AlreadyDone already opened under the new KEK (an earlier, interrupted
	// run re-sealed them).
	AlreadyDone int `json:"already_done"`
}

// Add adds c's counts to r.
func (r *RekeyCount) Add(c RekeyCount) {
	r.Resealed += c.Resealed
	r.AlreadyDone += c.AlreadyDone
}

// CheckRekeyPair refuses a rotation from old to next that would do nothing
// or lose the keys: either key all-zero, or both the same key.
func CheckRekeyPair(old, next KEK) error {
	if old == (KEK{}) || next == (KEK{}) {
		return errors.New("pki: refusing an all-zero key-encryption key")
	}
	if old == next {
		return errors.New("pki: the new key-encryption key is the old one")
	}
	return nil
}

// Reseal moves one sealed item from old to next, keeping its aad. When it
// already opens under next it answers changed false and out nil (a rotation
// run again after an interruption); when it opens under old it answers the
// item sealed under next; when it opens under neither, an error wrapping
// ErrNotUnderEitherKey. The plaintext is cleared before it returns.
func Reseal(old, next KEK, sealed, aad []byte) (out []byte, changed bool, err error) {
	if err := CheckRekeyPair(old, next); err != nil {
		return nil, false, err
	}
	if pt, err := Open(next, sealed, aad); err == nil {
		clear(pt)
		return nil, false, nil
	}
	pt, err := Open(old, sealed, aad)
	if err != nil {
		return nil, false, ErrNotUnderEitherKey
	}
	defer clear(pt)
	out, err = Seal(next, pt, aad)
	if err != nil {
		return nil, false, err
	}
	return out, true, nil
}

// bundleAAD is the aad a bundle slot is sealed with.
func bundleAAD(name string) []byte { return []byte("bc-pki/" + name) }

// rekeySlots re-seals every sealed slot of b from old to next in memory,
// in name order, whatever slots the bundle has. It changes b only when
// every slot opens under one of the two keys; otherwise it names the first
// slot that does not.
func (b *Bundle) rekeySlots(old, next KEK) (RekeyCount, error) {
	names := make([]string, 0, len(b.sealed))
	for name := range b.sealed {
		names = append(names, name)
	}
	sort.Strings(names)
	var c RekeyCount
	fresh := map[string][]byte{}
	for _, name := range names {
		out, changed, err := Reseal(old, next, b.sealed[name], bundleAAD(name))
		if err != nil {
			return RekeyCount{}, fmt.Errorf("pki: bundle slot %s: %w", name, err)
		}
		if changed {
			fresh[name] = out
			c.Resealed++
		} else {
			c.AlreadyDone++
		}
	}
	for name, s := range fresh {
		b.sealed[name] = s
	}
	return c, nil
}

// CheckRekeyBundle tells what RekeyBundle would do to the bundle in dir,
// writing nothing: every slot must open under old or next. A rotation
// checks this before it touches the database, so that a wrong old key
// stops it before anything changes.
func CheckRekeyBundle(dir string, old, next KEK) (RekeyCount, error) {
	b, err := Load(dir)
	if err != nil {
		return RekeyCount{}, err
	}
	return b.rekeySlots(old, next)
}

// RekeyBundle re-seals every private key of the bundle in dir from old to
// next, each under its own aad ("bc-pki/" + slot), and writes the bundle
// back atomically (every other field as it was) when any slot changed. Run
// again after an interruption, it finds the slots done. A slot that opens
// under neither key stops it before anything is written.
func RekeyBundle(dir string, old, next KEK) (RekeyCount, error) {
	b, err := Load(dir)
	if err != nil {
		return RekeyCount{}, err
	}
	c, err := b.rekeySlots(old, next)
	if err != nil || c.Resealed == 0 {
		return c, err
	}
	if err := b.write(filepath.Join(dir, BundleFile), false); err != nil {
		return RekeyCount{}, err
	}
	return c, nil
}
