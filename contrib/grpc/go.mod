module github.com/ratelimit-go/ratelimit/contrib/grpc

go 1.26.8

require (
	github.com/benbjohnson/clock v1.3.5
	github.com/grpc-ecosystem/go-grpc-middleware/v2 v2.3.4
	github.com/ratelimit-go/ratelimit v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260706201446-f0a921348800
	google.golang.org/grpc v1.84.0
	google.golang.org/protobuf v1.36.11
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.57.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace github.com/ratelimit-go/ratelimit => ../..
