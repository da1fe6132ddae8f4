// kafkajs-check drives kafkajs 2.2.4 (npm, pinned in package-lock.json) against a broker
// for tests/e2e/test_kafkajs.py. Each subcommand does one thing a kafkajs application does
// and prints one JSON object on stdout (errors included, so the test sees what reached
// the application). kafkajs logs go to stderr.
'use strict'
const { Kafka, CompressionTypes, logLevel } = require('kafkajs')

function parse(argv) {
  const opts = { broker: '127.0.0.1:9092', n: 10, partition: 0, partitions: 1, codec: 'none',
    ts0: 0, step: 1, batch: 1, idempotent: false, prefix: 'v' }
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i].replace(/^--?/, '')
    if (k === 'idempotent') { opts.idempotent = true; continue }
    opts[k] = argv[++i]
  }
  for (const k of ['n', 'partition', 'partitions', 'ts0', 'step', 'batch']) opts[k] = Number(opts[k])
  return opts
}

const stderrLogger = () => ({ namespace, level, label, log }) => {
  process.stderr.write(`${label} [${namespace}] ${log.message} ${JSON.stringify(log)}\n`)
}

function client(opts) {
  return new Kafka({ clientId: 'kafkajs-check', brokers: [opts.broker], logLevel: logLevel.WARN,
    logCreator: stderrLogger, retry: { retries: 5, initialRetryTime: 200 } })
}

const out = (v) => process.stdout.write(JSON.stringify(v) + '\n')

async function produce(opts) {
  const producer = client(opts).producer({ idempotent: opts.idempotent,
    maxInFlightRequests: opts.idempotent ? 1 : undefined, allowAutoTopicCreation: false })
  await producer.connect()
  const compression = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP }[opts.codec]
  const base = opts.ts0 || Date.now()
  const offsets = []
  try {
    for (let i = 0; i < opts.n; i += opts.batch) {
      const messages = []
      for (let j = i; j < Math.min(i + opts.batch, opts.n); j++) {
        messages.push({ key: `k${j}`, value: `${opts.prefix}${j}`, partition: opts.partition,
          timestamp: String(base + j * opts.step), headers: { h: `x${j}` } })
      }
      // acks=-1 (kafkajs' default; required with idempotence): one record batch per call.
      const res = await producer.send({ topic: opts.topic, compression, messages, acks: -1 })
      for (let j = 0; j < messages.length; j++) offsets.push(Number(res[0].baseOffset) + j)
    }
  } finally {
    await producer.disconnect()
  }
  out({ offsets })
}

async function group(opts) {
  const consumer = client(opts).consumer({ groupId: opts.group, maxWaitTimeInMs: 200,
    sessionTimeout: 30000, rebalanceTimeout: 30000, allowAutoTopicCreation: false })
  await consumer.connect()
  await consumer.subscribe({ topics: [opts.topic], fromBeginning: true })
  const values = []
  let finish
  const done = new Promise((resolve) => { finish = resolve })
  // Commits are explicit and stop at the n-th record, so the next member resumes exactly
  // after it (kafkajs' autoCommit would also commit records fetched in the same batch).
  await consumer.run({ autoCommit: false, eachMessage: async ({ topic, partition, message }) => {
    if (values.length >= opts.n) return
    values.push(message.value.toString())
    await consumer.commitOffsets([{ topic, partition, offset: (BigInt(message.offset) + 1n).toString() }])
    if (values.length >= opts.n) finish()
  } })
  const timer = setTimeout(() => finish(new Error(`timed out after ${values.length} of ${opts.n}`)), 60000)
  const err = await done
  clearTimeout(timer)
  await consumer.disconnect()
  if (err) throw err
  out({ values })
}

async function main() {
  const [cmd, ...rest] = process.argv.slice(2)
  const opts = parse(rest)
  const admin = client(opts).admin()
  try {
    if (cmd === 'produce') return await produce(opts)
    if (cmd === 'group') return await group(opts)
    await admin.connect()
    if (cmd === 'create') {
      const created = await admin.createTopics({ waitForLeaders: true,
        topics: [{ topic: opts.topic, numPartitions: opts.partitions, replicationFactor: 1 }] })
      const md = await admin.fetchTopicMetadata({ topics: [opts.topic] })
      out({ created, partitions: md.topics[0].partitions.length })
    } else if (cmd === 'delete') {
      await admin.deleteTopics({ topics: [opts.topic], timeout: 10000 })
      out({ topics: await admin.listTopics() })
    } else if (cmd === 'offsets') {
      const answers = {}
      for (const t of String(opts.times).split(',')) {
        const res = await admin.fetchTopicOffsetsByTimestamp(opts.topic, Number(t))
        answers[t] = Number(res.find((p) => p.partition === opts.partition).offset)
      }
      out({ offsets: answers })
    } else if (cmd === 'committed') {
      const res = await admin.fetchOffsets({ groupId: opts.group, topics: [opts.topic] })
      out({ offsets: res[0].partitions.map((p) => [p.partition, Number(p.offset)]) })
    } else {
      throw new Error(`unknown command ${cmd}`)
    }
  } finally {
    await admin.disconnect()
  }
}

main().catch((e) => { out({ error: `${e.name}: ${e.message}`, type: e.type }); process.exit(0) })
