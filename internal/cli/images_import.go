package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/clisafe"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/ociimage"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// imageSource is where images import reads an image from: exactly one of
// a root filesystem directory, an image tar, or an OCI image (a layout
// directory or a docker save archive, ref picking one of several).
type imageSource struct {
	rootfs, tarFile, oci, ref string
}

// open returns the image tar to upload and its size; a tar made here
// (from --rootfs or --oci) is a temporary 0600 file removed by done.
func (s imageSource) open(stderr io.Writer) (f *os.File, size int64, done func(), err error) {
	n := 0
	for _, v := range []string{s.rootfs, s.tarFile, s.oci} {
		if v != "" {
			n++
		}
	}
	if n != 1 || s.ref != "" && s.oci == "" {
		return nil, 0, nil, &ExitError{Code: 2, Err: errors.New("give exactly one of --rootfs, --tar or --oci (--ref goes with --oci)")}
	}
	if s.tarFile != "" {
		if f, err = os.Open(s.tarFile); err != nil {
			return nil, 0, nil, &ExitError{Code: 2, Err: err}
		}
	} else if f, err = s.build(stderr); err != nil {
		return nil, 0, nil, err
	}
	done = func() {
		f.Close()
		if s.tarFile == "" {
			os.Remove(f.Name())
		}
	}
	st, err := f.Stat()
	if err != nil {
		done()
		return nil, 0, nil, fmt.Errorf("images import: %w", err)
	}
	return f, st.Size(), done, nil
}

// build writes the image tar of --rootfs or --oci to a temporary file.
func (s imageSource) build(stderr io.Writer) (*os.File, error) {
	f, err := os.CreateTemp("", "bc-image-*.tar")
	if err != nil {
		return nil, fmt.Errorf("images import: %w", err)
	}
	fail := func(err error) (*os.File, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, &ExitError{Code: 2, Err: err}
	}
	if s.rootfs != "" {
		if err := imagetar.FromDir(s.rootfs, f); err != nil {
			return fail(err)
		}
		return f, nil
	}
	img, err := ociimage.Open(s.oci, s.ref)
	if err != nil {
		return fail(err)
	}
	st, err := ociimage.Flatten(img, f, spec.MaxImageBytes)
	if err != nil {
		return fail(err)
	}
	if len(st.Skipped) > 0 {
		fmt.Fprintf(stderr, "left out %d entries a sandbox image cannot hold (device nodes, FIFOs), such as %s\n", len(st.Skipped), clisafe.Clean(st.Skipped[0]))
	}
	return f, nil
}

// uploadProgress returns the progress function of an upload: a progress
// bar on a terminal, nothing otherwise; finish clears the bar.
func uploadProgress(stderr io.Writer, name string, size int64) (progress func(int64), finish func()) {
	f, ok := clisafe.Raw(stderr).(*os.File)
	if !ok || !isTerminal(f) {
		return nil, func() {}
	}
	bar := progressbar.NewOptions64(size, progressbar.OptionSetWriter(f), progressbar.OptionShowBytes(true),
		progressbar.OptionSetDescription("uploading "+clisafe.Clean(name)), progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionShowCount(), progressbar.OptionClearOnFinish(), progressbar.OptionSetWidth(30))
	return func(n int64) { _ = bar.Set64(n) }, func() { _ = bar.Finish() }
}

func imageImportCmd() *cobra.Command {
	var src imageSource
	var tenant string
	var asJSON bool
	c := &cobra.Command{Use: "import NAME (--rootfs DIR | --tar FILE | --oci PATH [--ref REF])",
		Short: "Store a root filesystem as an image named by its SHA-256",
		Long: "Store a root filesystem as an image named by its SHA-256: a directory, an image tar, or an OCI image\n" +
			"(an OCI image layout directory or a `docker save` archive, its layers flattened). The tar streams\n" +
			"through the upload endpoint, resumed after a cut, with a progress bar on a terminal.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, size, done, err := src.open(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer done()
			cl, err := apiClient()
			if err != nil {
				return err
			}
			progress, finish := uploadProgress(cmd.ErrOrStderr(), args[0], size)
			start := time.Now()
			img, err := cl.ImportImageFrom(contextOf(cmd), tenant, args[0], f, size, progress)
			finish()
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), img)
			}
			rate := float64(img.SizeBytes) / 1e6 / max(time.Since(start).Seconds(), 1e-3)
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s (%s, %.1f MB/s)\n", img.Name, img.Digest, sizeText(img.SizeBytes), rate)
			return err
		}}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	c.Flags().StringVar(&src.rootfs, "rootfs", "", "directory holding the root filesystem")
	c.Flags().StringVar(&src.tarFile, "tar", "", "tar of the root filesystem")
	c.Flags().StringVar(&src.oci, "oci", "", "OCI image: an OCI image layout directory or a docker save archive")
	c.Flags().StringVar(&src.ref, "ref", "", "with --oci: the image to take when there are several (ref.name or repo:tag)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
