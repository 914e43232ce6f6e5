module github.com/jobfence/jobfence/sdk/go

go 1.19

require (
	// grpc-go 1.33 marshals through github.com/golang/protobuf: only 1.5
	// handles the APIv2 messages of jobfencepb.
	github.com/golang/protobuf v1.5.2 // indirect
	google.golang.org/genproto v0.0.0-20200526211855-cb27e3aa2013
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
