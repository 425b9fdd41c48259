package pki

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// bundleFile reads dir's bundle.json and its fields other than the sealed
// keys, re-encoded, to compare what a rotation must leave as it was.
func bundleFile(t *testing.T, dir string) (raw []byte, public string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "sealed")
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return raw, string(out)
}

// assertUnderOnly checks that every key of the bundle in dir unseals under
// kek to the private bytes want, and no key under any of others.
func assertUnderOnly(t *testing.T, dir string, kek KEK, want map[string][]byte, others ...KEK) {
	t.Helper()
	b, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := privateSecrets(t, b, kek)
	for name := range want {
		if !bytes.Equal(want[name], got[name]) {
			t.Fatalf("%s: a different key after the rotation", name)
		}
	}
	for _, o := range others {
		for name, s := range b.sealed {
			if _, err := Open(o, s, bundleAAD(name)); !errors.Is(err, ErrSealBroken) {
				t.Fatalf("%s still opens under another key: %v", name, err)
			}
		}
	}
}

// TestRekeyBundleRoundTrip: every private key of the bundle moves to the
// new KEK, the same key, and nothing stays readable under the old one; the
// public fields are kept; a second run finds everything done and writes
// nothing.
func TestRekeyBundleRoundTrip(t *testing.T) {
	b, old, dir := newBundle(t)
	if _, err := PinApprovers(dir, approverKeys(t, 3), 2); err != nil {
		t.Fatal(err)
	}
	next := testKEK(99)
	want := privateSecrets(t, b, old)
	_, publicBefore := bundleFile(t, dir)
	c, err := RekeyBundle(dir, old, next)
	if err != nil || c != (RekeyCount{Resealed: 6}) {
		t.Fatalf("rekey: %+v %v, want 6 re-sealed (five keys and the break-glass SSH CA)", c, err)
	}
	raw, publicAfter := bundleFile(t, dir)
	if publicAfter != publicBefore {
		t.Fatalf("the rotation changed the bundle's public fields:\n%s\n%s", publicBefore, publicAfter)
	}
	if fi, err := os.Stat(filepath.Join(dir, BundleFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("bundle.json mode after rotation: %v %v", fi.Mode(), err)
	}
	assertUnderOnly(t, dir, next, want, old)
	c, err = RekeyBundle(dir, old, next)
	if err != nil || c != (RekeyCount{AlreadyDone: 6}) {
		t.Fatalf("second run: %+v %v, want 6 already done", c, err)
	}
	if again, _ := bundleFile(t, dir); !bytes.Equal(again, raw) {
		t.Fatal("a run with nothing to do rewrote the bundle")
	}
}

// TestRekeyBundleResumes: a bundle with some slots already under the new
// KEK (an interrupted run) is finished; those slots are counted done.
func TestRekeyBundleResumes(t *testing.T) {
	b, old, dir := newBundle(t)
	next := testKEK(99)
	want := privateSecrets(t, b, old)
	for _, name := range []string{keyNodeCA, keyAudit} {
		out, changed, err := Reseal(old, next, b.sealed[name], bundleAAD(name))
		if err != nil || !changed {
			t.Fatalf("%s: %v %v", name, changed, err)
		}
		b.sealed[name] = out
	}
	if err := b.write(filepath.Join(dir, BundleFile), false); err != nil {
		t.Fatal(err)
	}
	if c, err := CheckRekeyBundle(dir, old, next); err != nil || c != (RekeyCount{Resealed: 4, AlreadyDone: 2}) {
		t.Fatalf("check: %+v %v", c, err)
	}
	c, err := RekeyBundle(dir, old, next)
	if err != nil || c != (RekeyCount{Resealed: 4, AlreadyDone: 2}) {
		t.Fatalf("rekey: %+v %v, want 3 re-sealed and 2 done", c, err)
	}
	assertUnderOnly(t, dir, next, want, old)
}

// TestRekeyBundleRefusesAThirdKey: a slot under neither key (here the join
// key, sealed under a third KEK) stops the rotation naming the slot, and
// the bundle file is left byte for byte as it was; a wrong old key is
// refused the same way.
func TestRekeyBundleRefusesAThirdKey(t *testing.T) {
	b, old, dir := newBundle(t)
	next, third := testKEK(99), testKEK(150)
	der, err := Open(old, b.sealed[keyJoin], bundleAAD(keyJoin))
	if err != nil {
		t.Fatal(err)
	}
	if b.sealed[keyJoin], err = Seal(third, der, bundleAAD(keyJoin)); err != nil {
		t.Fatal(err)
	}
	if err := b.write(filepath.Join(dir, BundleFile), false); err != nil {
		t.Fatal(err)
	}
	before, _ := bundleFile(t, dir)
	for _, f := range []func(string, KEK, KEK) (RekeyCount, error){CheckRekeyBundle, RekeyBundle} {
		_, err := f(dir, old, next)
		if !errors.Is(err, ErrNotUnderEitherKey) || !strings.Contains(err.Error(), "bundle slot "+keyJoin+":") {
			t.Fatalf("err = %v, want ErrNotUnderEitherKey naming %s", err, keyJoin)
		}
	}
	if after, _ := bundleFile(t, dir); !bytes.Equal(after, before) {
		t.Fatal("a refused rotation changed the bundle")
	}
	if _, err := RekeyBundle(dir, testKEK(200), next); !errors.Is(err, ErrNotUnderEitherKey) || !strings.Contains(err.Error(), "bundle slot "+keyAudit+":") {
		t.Fatalf("wrong old key: %v, want the first slot in name order named", err)
	}
}

// TestRekeyKeepsAADBinding: a re-sealed item opens under the new key with
// its own aad only, so a blob still cannot be moved to another slot or
// row; Reseal given another aad than the item's refuses it.
func TestRekeyKeepsAADBinding(t *testing.T) {
	old, next := testKEK(1), testKEK(99)
	sealed, err := Seal(old, []byte("private"), []byte("bc-pki/node-ca"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Reseal(old, next, sealed, []byte("bc-pki/join-key")); !errors.Is(err, ErrNotUnderEitherKey) {
		t.Fatalf("reseal under another aad: %v", err)
	}
	out, changed, err := Reseal(old, next, sealed, []byte("bc-pki/node-ca"))
	if err != nil || !changed {
		t.Fatalf("reseal: %v %v", changed, err)
	}
	if pt, err := Open(next, out, []byte("bc-pki/node-ca")); err != nil || string(pt) != "private" {
		t.Fatalf("open under the new key: %q %v", pt, err)
	}
	for _, c := range []struct {
		kek KEK
		aad string
	}{{next, "bc-pki/join-key"}, {old, "bc-pki/node-ca"}} {
		if _, err := Open(c.kek, out, []byte(c.aad)); !errors.Is(err, ErrSealBroken) {
			t.Fatalf("opens under %q with the wrong key or aad: %v", c.aad, err)
		}
	}
	// In a bundle: two re-sealed slots swapped do not unseal.
	_, bold, dir := newBundle(t)
	if _, err := RekeyBundle(dir, bold, next); err != nil {
		t.Fatal(err)
	}
	b, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	b.sealed[keyJoin], b.sealed[keyAudit] = b.sealed[keyAudit], b.sealed[keyJoin]
	if _, err := b.JoinSigningKey(next); !errors.Is(err, ErrSealBroken) {
		t.Fatalf("a swapped slot unsealed: %v", err)
	}
}

// TestRekeySlotsIsGeneric: every slot the bundle holds is re-sealed under
// its own "bc-pki/<name>", whatever its name, not only the five of Init.
func TestRekeySlotsIsGeneric(t *testing.T) {
	b, old, _ := newBundle(t)
	next := testKEK(99)
	const extra = "next/node-ca"
	s, err := Seal(old, []byte("staged"), bundleAAD(extra))
	if err != nil {
		t.Fatal(err)
	}
	b.sealed[extra] = s
	c, err := b.rekeySlots(old, next)
	if err != nil || c != (RekeyCount{Resealed: 7}) {
		t.Fatalf("%+v %v, want 7 re-sealed", c, err)
	}
	if pt, err := Open(next, b.sealed[extra], bundleAAD(extra)); err != nil || string(pt) != "staged" {
		t.Fatalf("the extra slot: %q %v", pt, err)
	}
}

// TestCheckRekeyPair: an all-zero key and the same key twice are refused,
// by the check and by Reseal.
func TestCheckRekeyPair(t *testing.T) {
	k := testKEK(5)
	sealed, err := Seal(k, []byte("x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]KEK{{k, k}, {k, {}}, {{}, k}} {
		if err := CheckRekeyPair(p[0], p[1]); err == nil {
			t.Fatalf("pair %v accepted", p)
		}
		if _, _, err := Reseal(p[0], p[1], sealed, nil); err == nil || errors.Is(err, ErrNotUnderEitherKey) {
			t.Fatalf("Reseal accepted a bad pair: %v", err)
		}
	}
	if err := CheckRekeyPair(k, testKEK(6)); err != nil {
		t.Fatal(err)
	}
}

// TestLoadKEKFileIgnoresEnv: the new key is read from its file even when
// BC_KEK (the old key) is set, so the old key cannot stand in for it.
func TestLoadKEKFileIgnoresEnv(t *testing.T) {
	fileKEK := testKEK(10)
	path := writeKEKFile(t, t.TempDir(), fileKEK, 0o600)
	envKEK := testKEK(20)
	t.Setenv(KEKEnv, base64.StdEncoding.EncodeToString(envKEK[:]))
	if k, err := LoadKEK(path); err != nil || k != envKEK {
		t.Fatalf("LoadKEK: %v", err)
	}
	if k, err := LoadKEKFile(path); err != nil || k != fileKEK {
		t.Fatalf("LoadKEKFile took the environment: %v", err)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKEKFile(path); err == nil {
		t.Fatal("LoadKEKFile read a group-readable file")
	}
}

// FuzzReseal: whatever bytes a row or slot holds, Reseal never panics; it
// refuses them (ErrNotUnderEitherKey), finds them done, or answers bytes
// that open under the new key, with the same aad, to what they held under
// the old.
func FuzzReseal(f *testing.F) {
	old, next := testKEK(1), testKEK(99)
	for _, k := range []KEK{old, next} {
		s, err := Seal(k, []byte("seed"), []byte("bc-pki/node-ca"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(s, []byte("bc-pki/node-ca"))
	}
	f.Add([]byte{1}, []byte(nil))
	f.Fuzz(func(t *testing.T, sealed, aad []byte) {
		out, changed, err := Reseal(old, next, sealed, aad)
		switch {
		case err != nil:
			if !errors.Is(err, ErrNotUnderEitherKey) {
				t.Fatalf("refused with %v", err)
			}
		case !changed:
			if _, err := Open(next, sealed, aad); err != nil {
				t.Fatalf("counted done but does not open under the new key: %v", err)
			}
		default:
			was, err1 := Open(old, sealed, aad)
			now, err2 := Open(next, out, aad)
			if err1 != nil || err2 != nil || !bytes.Equal(was, now) {
				t.Fatalf("re-sealed to other bytes: %v %v", err1, err2)
			}
		}
	})
}
