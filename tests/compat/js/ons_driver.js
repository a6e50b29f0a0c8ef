'use strict';
// Drives the npm ali-ons client against a plain RocketMQ name server for tests/compat/test_ali_ons.py.
//
//   node ons_driver.js produce --namesrv H:P --group G --topic T --count N [--tags TagA] [--prefix p]
//   node ons_driver.js consume --namesrv H:P --group G --topic T --expect N [--expr '*'] [--timeout-ms 60000]
//
// One JSON object per line on stdout ("sent", "received", "error", "done"); diagnostics on stderr.
// Exit codes: 0 success, 1 a client error, 3 the consumer timed out before --expect messages.
//
// Pointing ali-ons at a plain name server: pass `nameSrv` (the list is used as is, and the
// Aliyun `onsAddr` HTTP lookup is skipped) and leave out accessKeyId/accessKeySecret (requests
// are then not signed; see lib/channel.js beforeRequest). `httpclient` is asserted present but
// only used for onsAddr, so an empty object will do.

const { Producer, Consumer, Message } = require('ali-ons');

function parseArgs(argv) {
  const args = { _: argv[0] };
  for (let i = 1; i < argv.length; i += 2) {
    args[argv[i].replace(/^--/, '')] = argv[i + 1];
  }
  return args;
}

function emit(event, fields) {
  process.stdout.write(JSON.stringify(Object.assign({ event }, fields)) + '\n');
}

function clientOptions(args) {
  return {
    httpclient: {},
    nameSrv: args.namesrv.split(';'),
  };
}

async function produce(args) {
  const producer = new Producer(Object.assign(clientOptions(args), { producerGroup: args.group }));
  producer.on('error', err => emit('error', { error: String(err && err.stack || err) }));
  await producer.ready();
  const count = Number(args.count);
  const prefix = args.prefix || 'ons';
  for (let i = 0; i < count; i++) {
    const body = `${prefix}-${i}`;
    const msg = new Message(args.topic, args.tags || 'TagA', body);
    msg.keys = [ `key-${i}` ];
    const result = await producer.send(msg);
    emit('sent', {
      body,
      sendStatus: result.sendStatus,
      msgId: result.msgId,
      queueId: result.messageQueue.queueId,
      queueOffset: result.queueOffset,
    });
  }
  await producer.close();
  emit('done', { count });
}

async function consume(args) {
  const expect = Number(args.expect);
  const timeoutMs = Number(args['timeout-ms'] || 60000);
  const consumer = new Consumer(Object.assign(clientOptions(args), { consumerGroup: args.group }));
  consumer.on('error', err => emit('error', { error: String(err && err.stack || err) }));
  let received = 0;
  let finish;
  const finished = new Promise(resolve => { finish = resolve; });
  consumer.subscribe(args.topic, args.expr || '*', async msg => {
    received += 1;
    emit('received', {
      body: msg.body.toString(),
      tags: msg.tags,
      keys: msg.keys,
      msgId: msg.msgId,
      queueId: msg.queueId,
      queueOffset: msg.queueOffset,
      reconsumeTimes: msg.reconsumeTimes,
    });
    if (received >= expect) {
      finish(true);
    }
  });
  await consumer.ready();
  emit('ready', {});
  const timer = setTimeout(() => finish(false), timeoutMs);
  const complete = await finished;
  clearTimeout(timer);
  await consumer.close();
  emit('done', { count: received, complete });
  return complete ? 0 : 3;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args._ === 'produce') {
    await produce(args);
    return 0;
  }
  if (args._ === 'consume') {
    return await consume(args);
  }
  throw new Error(`unknown command ${args._}`);
}

main().then(code => {
  process.exit(code);
}, err => {
  emit('error', { error: String(err && err.stack || err) });
  process.exit(1);
});
