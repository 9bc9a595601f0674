import sys, threading, time
from concurrent import futures
import grpc

def server(port, cert=None, key=None):
    def unary(req, ctx):
        md = dict(ctx.invocation_metadata())
        ctx.set_trailing_metadata((('x-trailer', 'yes'),))
        if req == b'fail':
            ctx.abort(grpc.StatusCode.NOT_FOUND, 'no such thing')
        if req == b'slow':
            time.sleep(3)
        return b'echo:' + req + b'|' + md.get('x-set', '-').encode()
    def server_stream(req, ctx):
        for i in range(3):
            yield req + str(i).encode()
    def client_stream(it, ctx):
        return b','.join(it)
    def bidi(it, ctx):
        for m in it:
            yield b'<' + m + b'>'
    # The second message waits until another call releases it: a client
    # sees the first only if the proxy passes messages on as they come.
    release = threading.Event()
    def held(req, ctx):
        yield b'first'
        release.wait(30)
        release.clear()
        yield b'second'
    def release_call(req, ctx):
        release.set()
        return b'released'
    h = {
        'Unary': grpc.unary_unary_rpc_method_handler(unary),
        'ServerStream': grpc.unary_stream_rpc_method_handler(server_stream),
        'ClientStream': grpc.stream_unary_rpc_method_handler(client_stream),
        'Bidi': grpc.stream_stream_rpc_method_handler(bidi),
        'Held': grpc.unary_stream_rpc_method_handler(held),
        'Release': grpc.unary_unary_rpc_method_handler(release_call),
    }
    s = grpc.server(futures.ThreadPoolExecutor(8))
    s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler('t.S', h),))
    addr = '127.0.0.1:%s' % port
    if cert:
        creds = grpc.ssl_server_credentials(((open(key, 'rb').read(), open(cert, 'rb').read()),))
        s.add_secure_port(addr, creds)
    else:
        s.add_insecure_port(addr)
    s.start()
    print('ready', flush=True)
    s.wait_for_termination()

def client(port, path):
    ch = grpc.insecure_channel('127.0.0.1:%s' % port)
    grpc.channel_ready_future(ch).result(timeout=10)
    def show(f):
        try:
            r = f()
            return 'OK ' + repr(r)
        except grpc.RpcError as e:
            return 'ERR %s %s' % (e.code().name, e.details())
    pre = path
    def unary_md():
        r, call = ch.unary_unary(pre + '/t.S/Unary').with_call(b'hi', timeout=10)
        return (r, sorted((k, v) for k, v in call.trailing_metadata() if k.startswith('x-')))
    print('unary', show(unary_md))
    print('fail', show(lambda: ch.unary_unary(pre + '/t.S/Unary')(b'fail', timeout=10)))
    print('sstream', show(lambda: list(ch.unary_stream(pre + '/t.S/ServerStream')(b'm', timeout=10))))
    print('cstream', show(lambda: ch.stream_unary(pre + '/t.S/ClientStream')(iter([b'a', b'b', b'c']), timeout=10)))
    print('bidi', show(lambda: list(ch.stream_stream(pre + '/t.S/Bidi')(iter([b'x', b'y']), timeout=10))))
    print('big', show(lambda: len(ch.unary_unary(pre + '/t.S/Unary')(b'z' * 300000, timeout=10))))
    def held():
        it = ch.unary_stream(pre + '/t.S/Held')(b'h', timeout=10)
        first = next(it)
        r = ch.unary_unary(pre + '/t.S/Release')(b'', timeout=10)
        return [first, r] + list(it)
    print('held', show(held))
    print('slow', show(lambda: ch.unary_unary(pre + '/t.S/Unary')(b'slow', timeout=10)))

if sys.argv[1] == 'server':
    server(sys.argv[2], *sys.argv[3:])
else:
    client(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else '')
