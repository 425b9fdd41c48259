package integration_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/ociimage"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestImagesImportOCI: `images import --oci` takes an OCI image layout
// directory or a docker save archive, flattens it and streams it through
// the upload endpoint; off a terminal it prints one plain final line and
// no progress bar; a bad combination of sources is a usage error (2).
func TestImagesImportOCI(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{SandboxRuntime: spec.RuntimeSim})
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	layer, err := random.Layer(64<<10, "application/vnd.oci.image.layer.v1.tar")
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	var flat bytes.Buffer
	if _, err := ociimage.Flatten(img, &flat, spec.MaxImageBytes); err != nil {
		t.Fatal(err)
	}
	want := imagetar.Digest(flat.Bytes())

	dir := t.TempDir()
	p, err := layout.Write(dir+"/layout", empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("example.com/x:1")
	if err := tarball.WriteToFile(dir+"/saved.tar", tag, img); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{dir + "/layout", dir + "/saved.tar"} {
		var out, errb bytes.Buffer
		if code := cli.Main([]string{"images", "import", "oci", "--oci", src}, &out, &errb); code != 0 {
			t.Fatalf("import %s: exit %d: %s", src, code, errb.String())
		}
		line := out.String()
		if !strings.HasPrefix(line, "oci "+want+" (") || strings.Count(line, "\n") != 1 || errb.Len() != 0 {
			t.Fatalf("import %s printed %q / %q, want one line with %s", src, line, errb.String(), want)
		}
	}
	imgs, err := e.CP.Sandboxes.ListImages(context.Background(), iam.ScopeOf(iam.RootTenant))
	if err != nil || len(imgs) != 1 || imgs[0].Digest != want {
		t.Fatalf("images %+v %v", imgs, err)
	}
	var out, errb bytes.Buffer
	if code := cli.Main([]string{"images", "import", "oci", "--oci", dir + "/layout", "--tar", dir + "/saved.tar"}, &out, &errb); code != 2 {
		t.Fatalf("two sources: exit %d, want 2", code)
	}
}
