use std::net::IpAddr;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn classes_follow_the_registries() {
    let table: &[(&str, Class)] = &[
        // IPv4
        ("8.8.8.8", Public),
        ("1.1.1.1", Public),
        ("0.0.0.0", Unspecified),
        ("0.1.2.3", ThisNetwork),
        ("10.0.0.1", Private),
        ("10.255.255.255", Private),
        ("100.63.255.255", Public),
        ("100.64.0.1", Cgnat),
        ("100.127.255.255", Cgnat),
        ("100.128.0.0", Public),
        ("127.0.0.1", Loopback),
        ("127.255.255.254", Loopback),
        ("169.254.0.1", LinkLocal),
        ("169.254.169.254", Metadata),
        ("169.254.170.2", Metadata),
        ("100.100.100.200", Metadata),
        ("168.63.129.16", Metadata),
        ("172.15.255.255", Public),
        ("172.16.0.1", Private),
        ("172.31.255.255", Private),
        ("172.32.0.0", Public),
        ("192.0.0.9", Reserved),
        ("192.0.2.1", Documentation),
        ("192.88.99.1", Reserved),
        ("192.168.1.1", Private),
        ("198.17.255.255", Public),
        ("198.18.0.1", Benchmarking),
        ("198.19.255.255", Benchmarking),
        ("198.20.0.0", Public),
        ("198.51.100.7", Documentation),
        ("203.0.113.7", Documentation),
        ("224.0.0.1", Multicast),
        ("239.255.255.255", Multicast),
        ("240.0.0.1", Reserved),
        ("255.255.255.254", Reserved),
        ("255.255.255.255", Broadcast),
        // IPv6
        ("2606:4700::1111", Public),
        ("::", Unspecified),
        ("::1", Loopback),
        ("::ffff:127.0.0.1", EmbeddedIpv4),
        ("::ffff:8.8.8.8", EmbeddedIpv4),
        ("::ffff:0.0.0.0", EmbeddedIpv4),
        ("::ffff:0:169.254.169.254", EmbeddedIpv4),
        ("::127.0.0.1", EmbeddedIpv4),
        ("::2", EmbeddedIpv4),
        ("64:ff9b::7f00:1", EmbeddedIpv4),
        ("64:ff9b::808:808", EmbeddedIpv4),
        ("64:ff9b:1::a9fe:a9fe", EmbeddedIpv4),
        ("64:ff9b:2::1", Reserved),
        ("2002:7f00:1::1", EmbeddedIpv4),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", EmbeddedIpv4),
        ("2001:1::1", Public),
        ("2001:1::4", Reserved),
        ("2001:2::1", Benchmarking),
        ("2001:3::1", Public),
        ("2001:20::1", Public),
        ("2001:10::1", Reserved),
        ("2001:db8::1", Documentation),
        ("2001:db8:100::7", Documentation),
        ("2001:db9::1", Public),
        ("3fff::1", Documentation),
        ("3fff:1000::1", Public),
        ("100::1", Reserved),
        ("100:0:0:1::1", Reserved),
        ("5f00::1", Reserved),
        ("fc00::1", Private),
        ("fd00::1", Private),
        ("fd00:ec2::254", Metadata),
        ("fd00:ec2::253", Private),
        ("fe80::1", LinkLocal),
        ("febf::1", LinkLocal),
        ("fec0::1", Reserved),
        ("ff02::1", Multicast),
        ("4000::1", Reserved),
        ("1::1", Reserved),
    ];
    for (addr, class) in table {
        assert_eq!(classify(ip(addr)), *class, "{addr}");
    }
}

#[test]
fn allow_private_never_covers_metadata_nor_embedded_ipv4() {
    let covered = [Loopback, Private, LinkLocal, Cgnat, Documentation, Benchmarking, Reserved];
    let not = [Public, Metadata, EmbeddedIpv4, Multicast, Broadcast, Unspecified, ThisNetwork];
    assert!(covered.iter().all(|c| c.allow_private_covers()));
    assert!(not.iter().all(|c| !c.allow_private_covers()));
    assert_eq!(Class::EmbeddedIpv4.to_string(), "embedded-ipv4");
    assert_eq!(Class::LinkLocal.as_str(), "link-local");
}

#[test]
fn cidrs_parse_strictly() {
    let good: &[(&str, &str, &str, bool)] = &[
        ("203.0.113.0/24", "203.0.113.0/24", "203.0.113.255", true),
        ("203.0.113.0/24", "203.0.113.0/24", "203.0.114.0", false),
        ("2001:db8:100::/48", "2001:db8:100::/48", "2001:db8:100:ffff::1", true),
        ("2001:db8:100::/48", "2001:db8:100::/48", "2001:db8:101::1", false),
        ("0.0.0.0/0", "0.0.0.0/0", "8.8.8.8", true),
        ("0.0.0.0/0", "0.0.0.0/0", "::1", false),
        ("192.0.2.7/32", "192.0.2.7/32", "192.0.2.7", true),
        ("2001:DB8::1/128", "2001:db8::1/128", "2001:db8::1", true),
    ];
    for (text, shown, probe, inside) in good {
        let c: Cidr = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(c.to_string(), *shown);
        assert_eq!(c.contains(ip(probe)), *inside, "{text} contains {probe}");
    }
    let bad: &[(&str, &str)] = &[
        ("203.0.113.0", "invalid range \"203.0.113.0\": expected a CIDR such as \"203.0.113.0/24\" or \"2001:db8:100::/48\""),
        ("203.0.113/24", "invalid range \"203.0.113/24\": expected a CIDR"),
        ("0x7f.0.0.0/8", "invalid range \"0x7f.0.0.0/8\": expected a CIDR"),
        ("010.0.0.0/8", "invalid range \"010.0.0.0/8\": expected a CIDR"),
        ("10.0.0.0/", "expected a CIDR"),
        ("10.0.0.0/+8", "expected a CIDR"),
        ("10.0.0.0/ 8", "expected a CIDR"),
        ("[2001:db8::]/32", "expected a CIDR"),
        ("10.0.0.0/33", "invalid range \"10.0.0.0/33\": the prefix length must be 0-32"),
        ("2001:db8::/129", "the prefix length must be 0-128"),
        ("10.0.0.1/8", "invalid range \"10.0.0.1/8\": bits are set after the prefix; write \"10.0.0.0/8\""),
        ("2001:db8::1/32", "write \"2001:db8::/32\""),
        ("", "expected a CIDR"),
    ];
    for (text, msg) in bad {
        let e = text.parse::<Cidr>().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains(msg), "{text}: {e}");
    }
}

#[test]
fn public_ranges_make_listed_addresses_public_but_never_metadata_or_embedded() {
    let r = PublicRanges::parse(&["203.0.113.0/24", "2001:db8:100::/48", "10.1.0.0/16", "::/0"][..3])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.classify(ip("203.0.113.7")), Public);
    assert_eq!(r.classify(ip("198.51.100.7")), Documentation);
    assert_eq!(r.classify(ip("2001:db8:100::7")), Public);
    assert_eq!(r.classify(ip("2001:db8:200::7")), Documentation);
    assert_eq!(r.classify(ip("10.1.2.3")), Public);
    assert_eq!(r.classify(ip("::ffff:203.0.113.7")), EmbeddedIpv4);

    let wide = PublicRanges::parse(&["::/1"]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(wide.classify(ip("::ffff:8.8.8.8")), EmbeddedIpv4, "embedded forms stay embedded");
    assert_eq!(wide.classify(ip("::")), Unspecified);
    assert_eq!(wide.classify(ip("::1")), Public, "a range that lists loopback makes it public");

    let refused: &[(&str, &str)] = &[
        ("169.254.0.0/16", "public_ranges: 169.254.0.0/16 covers the cloud metadata address 169.254.169.254, which is never public"),
        ("0.0.0.0/0", "covers the cloud metadata address 169.254.169.254"),
        ("fd00::/8", "covers the cloud metadata address fd00:ec2::254"),
        ("::/0", "covers the cloud metadata address fd00:ec2::254"),
        ("100.64.0.0/10", "covers the cloud metadata address 100.100.100.200"),
        ("nonsense", "public_ranges: invalid range \"nonsense\""),
    ];
    for (text, msg) in refused {
        let e = PublicRanges::parse(&[*text]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains(msg), "{text}: {e}");
    }
}
