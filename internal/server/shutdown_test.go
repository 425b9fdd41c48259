package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
)

// grpcUnderTest serves a gRPC server whose every method is handled by
// handle, under cp, and returns a client connection to it.
func grpcUnderTest(t *testing.T, cp *ControlPlane, handle grpc.StreamHandler, then func()) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp.serveGRPC("test", grpc.NewServer(grpc.UnknownServiceHandler(handle)), lis, then)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Close lets a unary call in flight finish (GracefulStop), and a stream
// that never ends (a node session) holds it only for the grace, after
// which the server is stopped and what waited for it runs.
func TestCloseStopsGRPCGracefullyWithinTheGrace(t *testing.T) {
	const grace = 300 * time.Millisecond
	cp := newControlPlane(context.Background(), grace)
	entered, release := make(chan string, 2), make(chan struct{})
	stopped := make(chan struct{})
	conn := grpcUnderTest(t, cp, func(_ any, s grpc.ServerStream) error {
		m, _ := grpc.MethodFromServerStream(s)
		entered <- m
		if m == "/t.T/Session" {
			<-s.Context().Done()
			return s.Context().Err()
		}
		if err := s.RecvMsg(new(emptypb.Empty)); err != nil {
			return err
		}
		<-release
		return s.SendMsg(&emptypb.Empty{})
	}, func() { close(stopped) })
	ctx := context.Background()
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/t.T/Session")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.SendMsg(&emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	unary := make(chan error, 1)
	go func() { unary <- conn.Invoke(ctx, "/t.T/Call", &emptypb.Empty{}, new(emptypb.Empty)) }()
	for range 2 {
		<-entered
	}
	start := time.Now()
	closed := make(chan struct{})
	go func() { cp.Close(); close(closed) }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	if err := <-unary; err != nil {
		t.Fatalf("the call in flight failed: %v", err)
	}
	<-closed
	if d := time.Since(start); d < grace-50*time.Millisecond || d > grace+2*time.Second {
		t.Fatalf("Close took %v with a stream open, want about the grace %v", d, grace)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("Close returned before the server's then ran")
	}
	if err := stream.RecvMsg(new(emptypb.Empty)); err == nil {
		t.Fatal("the open stream was not ended")
	}
	if err := cp.Err(); err != nil {
		t.Fatalf("Err after Close: %v", err)
	}
	select {
	case <-cp.Done():
	default:
		t.Fatal("Done is not closed after Close")
	}
}

// Close shuts an HTTP listener down letting a request in flight finish,
// and a request that never finishes holds it only for the grace.
func TestCloseShutsHTTPDownWithinTheGrace(t *testing.T) {
	const grace = 300 * time.Millisecond
	for _, finishes := range []bool{true, false} {
		cp := newControlPlane(context.Background(), grace)
		entered, release := make(chan struct{}), make(chan struct{})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cp.serveHTTP("test", &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			if finishes {
				<-release
			} else {
				<-r.Context().Done()
			}
			_, _ = w.Write([]byte("ok"))
		})}, lis)
		got := make(chan error, 1)
		go func() {
			resp, err := http.Get("http://" + lis.Addr().String() + "/")
			if err == nil {
				resp.Body.Close()
			}
			got <- err
		}()
		<-entered
		start := time.Now()
		closed := make(chan struct{})
		go func() { cp.Close(); close(closed) }()
		if finishes {
			time.Sleep(50 * time.Millisecond)
			close(release)
			if err := <-got; err != nil {
				t.Fatalf("the request in flight failed: %v", err)
			}
			<-closed
			if d := time.Since(start); d > grace {
				t.Fatalf("Close took %v after the last request finished", d)
			}
		} else {
			<-closed
			if d := time.Since(start); d < grace-50*time.Millisecond || d > grace+2*time.Second {
				t.Fatalf("Close took %v with a request hanging, want about the grace %v", d, grace)
			}
			<-got
		}
		if err := cp.Err(); err != nil {
			t.Fatalf("Err after Close: %v", err)
		}
	}
}

// A role that fails ends Done at once, and Err returns its error.
func TestARoleThatFailsStopsTheOthers(t *testing.T) {
	cp := newControlPlane(context.Background(), time.Second)
	other := make(chan struct{})
	cp.runLoop(func(ctx context.Context) { <-ctx.Done(); close(other) })
	boom := errors.New("boom")
	cp.run(func(context.Context) error { return boom })
	select {
	case <-cp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after a role failed")
	}
	<-other
	if err := cp.Err(); !errors.Is(err, boom) {
		t.Fatalf("Err = %v, want the role's error", err)
	}
}
