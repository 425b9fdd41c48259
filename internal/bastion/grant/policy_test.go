package grant

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func doc(id string, allow, deny []string, f func(*Doc)) Doc {
	d := Doc{V: 1, ID: id, Bastion: bastionID, Allow: allow, Deny: deny,
		IssuedAt: t0.Add(-time.Hour).UnixMilli(), ExpiresAt: t0.Add(time.Hour).UnixMilli()}
	if f != nil {
		f(&d)
	}
	return d
}

func TestDenyBeatsAllowAcrossGrants(t *testing.T) {
	a := doc("grt_a", []string{FamilyInference, FamilyModels, FamilyServices}, nil, func(d *Doc) {
		d.Models = []string{"llama3:8b"}
		d.Reach = []string{"db"}
	})
	b := doc("grt_b", []string{FamilyEgress}, []string{FamilyModels, FamilyServices}, nil)
	for _, order := range [][]Doc{{a, b}, {b, a}} {
		p := Effective(order, t0)
		if got, want := p.Families(), []string{FamilyEgress, FamilyInference}; !slices.Equal(got, want) {
			t.Fatalf("Families = %v, want %v", got, want)
		}
		if p.Allows(FamilyModels) || p.Allows(FamilyServices) {
			t.Fatal("a family denied by one grant is allowed by another")
		}
		if p.Reaches("db") {
			t.Fatal("Reaches(db) with services denied")
		}
		if !p.ModelInScope("llama3:8b") {
			t.Fatal("ModelInScope(llama3:8b) = false")
		}
	}
	// Denying inference takes the models out of scope too.
	p := Effective([]Doc{a, doc("grt_c", nil, []string{FamilyInference}, nil)}, t0)
	if p.ModelInScope("llama3:8b") || len(p.Models()) != 0 {
		t.Fatalf("model in scope with inference denied: %v", p.Models())
	}
}

func TestEffectiveIgnoresExpiredGrant(t *testing.T) {
	live := doc("grt_live", []string{FamilyInference}, nil, func(d *Doc) { d.Models = []string{"a:1"} })
	old := doc("grt_old", []string{FamilyEgress, FamilyServices}, []string{FamilyInference}, func(d *Doc) {
		d.ExpiresAt = t0.UnixMilli()
		d.Models = []string{"b:1"}
		d.Reach = []string{"db"}
	})
	p := Effective([]Doc{live, old}, t0)
	if got, want := p.Families(), []string{FamilyInference}; !slices.Equal(got, want) {
		t.Fatalf("Families = %v, want %v", got, want)
	}
	if p.ModelInScope("b:1") || !p.ModelInScope("a:1") {
		t.Fatalf("Models = %v, want [a:1]", p.Models())
	}
	if p.Reaches("db") {
		t.Fatal("an expired grant's reach is used")
	}
	// A millisecond earlier the old grant is current and its deny applies.
	if Effective([]Doc{live, old}, t0.Add(-time.Millisecond)).Allows(FamilyInference) {
		t.Fatal("a current grant's deny did not apply")
	}
	future := doc("grt_future", []string{FamilyEgress}, nil, func(d *Doc) {
		d.IssuedAt = t0.Add(6 * time.Minute).UnixMilli()
	})
	if Effective([]Doc{future}, t0).Allows(FamilyEgress) {
		t.Fatal("a grant issued 6 minutes ahead is used")
	}
}

func TestEffectiveMalformedGrantOnlyDenies(t *testing.T) {
	bad := doc("grt_bad", []string{FamilyEgress, "root"}, []string{FamilyInference}, nil)
	good := doc("grt_good", []string{FamilyInference}, nil, nil)
	p := Effective([]Doc{bad, good}, t0)
	if p.Allows(FamilyEgress) || p.Allows(FamilyInference) || len(p.Families()) != 0 {
		t.Fatalf("Families = %v, want none", p.Families())
	}
	var zero Policy
	if zero.Allows(FamilyInference) || zero.ModelInScope("a:1") || zero.Reaches("db") || len(zero.Models()) != 0 {
		t.Fatal("the zero Policy allows something")
	}
}

func TestModelNormalisation(t *testing.T) {
	d := doc("grt_m", []string{FamilyInference}, nil, func(d *Doc) {
		d.Models = []string{"llama3", "mistral:latest", "qwen:7b", "reg.example:5000/lib/phi", "llama3:latest"}
	})
	p := Effective([]Doc{d}, t0)
	in := []string{"llama3", "llama3:latest", "mistral", "mistral:latest", "qwen:7b", "reg.example:5000/lib/phi", "reg.example:5000/lib/phi:latest"}
	out := []string{"qwen", "qwen:latest", "llama3:8b", "LLAMA3", "library/llama3", "reg.example:5000/lib/phi:1", "", "llama3 ", "mistral:"}
	for _, m := range in {
		if !p.ModelInScope(m) {
			t.Errorf("ModelInScope(%q) = false", m)
		}
	}
	for _, m := range out {
		if p.ModelInScope(m) {
			t.Errorf("ModelInScope(%q) = true", m)
		}
	}
	want := []string{"llama3:latest", "mistral:latest", "qwen:7b", "reg.example:5000/lib/phi:latest"}
	if got := p.Models(); !slices.Equal(got, want) {
		t.Fatalf("Models = %v, want %v", got, want)
	}
	if Effective([]Doc{doc("grt_n", []string{FamilyModels}, nil, func(d *Doc) { d.Models = []string{"x:1"} })}, t0).ModelInScope("x:1") {
		t.Fatal("a model is in scope without inference")
	}
}

func TestReachesNeedsServicesAndName(t *testing.T) {
	d := doc("grt_r", []string{FamilyServices}, nil, func(d *Doc) { d.Reach = []string{"db"} })
	p := Effective([]Doc{d}, t0)
	if !p.Reaches("db") || p.Reaches("web") || p.Reaches("DB") {
		t.Fatal("Reaches is wrong for a services grant naming db")
	}
	d.Allow = nil
	if Effective([]Doc{d}, t0).Reaches("db") {
		t.Fatal("Reaches(db) without the services family")
	}
}

func TestGrantForAnotherBastion(t *testing.T) {
	skey, vkey := keys(t)
	d := validDoc()
	d.Bastion = "nod_other"
	msg := mustSign(t, skey, d)
	if _, r := Verify(msg, vkey, bastionID, t0); r != ReasonOtherBastion {
		t.Fatalf("Verify reason = %q, want %q", r, ReasonOtherBastion)
	}
	if _, r := Verify(msg, vkey, "nod_other", t0); r != "" {
		t.Fatalf("Verify for its own bastion: %q", r)
	}
}

func TestFamiliesSorted(t *testing.T) {
	fs := Families()
	if !slices.IsSorted(fs) || len(fs) != 4 {
		t.Fatalf("Families = %v", fs)
	}
	for _, f := range fs {
		if !knownFamily(f) {
			t.Fatalf("Families() lists %q, which knownFamily refuses", f)
		}
	}
	fs[0] = "root"
	if knownFamily("root") || Families()[0] != FamilyEgress {
		t.Fatal("changing the returned slice changed the known families")
	}
}
