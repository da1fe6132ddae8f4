// AclAdmin: the Java AdminClient's ACL calls (createAcls, describeAcls, deleteAcls), one per
// run, for tests/e2e/test_acl.py. Java 17 stdlib + kafka-clients only (3.9.1 and 4.3.0).
//
//   AclAdmin <bootstrap> create <TYPE> <name> <LITERAL|PREFIXED> <principal> <OPERATION> <ALLOW|DENY>
//   AclAdmin <bootstrap> describe                 every binding, one line each (see below)
//   AclAdmin <bootstrap> delete <TYPE>            deletes every binding of the type; prints them
// Each binding is printed as "<TYPE> <name> <PATTERN> <principal> <host> <OPERATION> <PERMISSION>".
// Any command also takes --prop key=value (repeatable). Exit 0 ok, 1 error.

import java.util.*;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.common.acl.*;
import org.apache.kafka.common.resource.*;

public final class AclAdmin {
    public static void main(String[] argv) throws Exception {
        List<String> args = new ArrayList<>();
        Properties props = new Properties();
        for (int i = 0; i < argv.length; i++) {
            if (argv[i].equals("--prop")) {
                String[] kv = argv[++i].split("=", 2);
                props.put(kv[0], kv[1]);
            } else {
                args.add(argv[i]);
            }
        }
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args.get(0));
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        try (Admin admin = Admin.create(props)) {
            switch (args.get(1)) {
                case "create" -> {
                    AclBinding b = new AclBinding(
                        new ResourcePattern(ResourceType.valueOf(args.get(2)), args.get(3), PatternType.valueOf(args.get(4))),
                        new AccessControlEntry(args.get(5), "*", AclOperation.valueOf(args.get(6)),
                                               AclPermissionType.valueOf(args.get(7))));
                    admin.createAcls(List.of(b)).all().get();
                }
                case "describe" -> {
                    for (AclBinding b : admin.describeAcls(AclBindingFilter.ANY).values().get()) print(b);
                }
                case "delete" -> {
                    AclBindingFilter f = new AclBindingFilter(
                        new ResourcePatternFilter(ResourceType.valueOf(args.get(2)), null, PatternType.ANY),
                        AccessControlEntryFilter.ANY);
                    for (AclBinding b : admin.deleteAcls(List.of(f)).all().get()) print(b);
                }
                default -> throw new IllegalArgumentException("unknown command " + args.get(1));
            }
        } catch (Exception e) {
            for (Throwable t = e; t != null; t = t.getCause()) System.err.println("ERROR " + t);
            System.exit(1);
        }
    }

    static void print(AclBinding b) {
        ResourcePattern p = b.pattern();
        AccessControlEntry e = b.entry();
        System.out.println(p.resourceType() + " " + p.name() + " " + p.patternType() + " " + e.principal() + " "
                           + e.host() + " " + e.operation() + " " + e.permissionType());
    }
}
